// The node list's facts about who speaks for a node and what it may report (GET /api/v1/nodes: credential,
// cards, tool_stalls), read defensively: a field that is missing or not what the API documents is unknown (null),
// never 0 and never a guess.

const CREDENTIAL_STATES = Object.freeze(["issued", "released", "none"]);

function count(value) {
  return Number.isInteger(value) && value >= 0 ? value : null;
}

function instant(value) {
  return typeof value === "string" && !Number.isNaN(new Date(value).getTime()) ? value : null;
}

/**
 * The node's credential: {state ("issued"/"released"/"none"), reissued (null: unknown), issuedAt, releasedAt}, or
 * null when the server did not say (an older server, or an answer without it).
 */
export function credentialInfo(credential) {
  if (!credential || typeof credential !== "object" || !CREDENTIAL_STATES.includes(credential.state)) return null;
  return {
    state: credential.state,
    reissued: typeof credential.reissued === "boolean" ? credential.reissued : null,
    issuedAt: instant(credential.issued_at),
    releasedAt: instant(credential.released_at),
  };
}

/**
 * The bounds on what the node reports and what they refused: every number null when unknown; ``full`` says a
 * count of this hour reached its bound (null when either is unknown); ``refused`` is the sum of the refusals
 * (null when any is unknown).
 */
export function cardsInfo(cards) {
  if (!cards || typeof cards !== "object") return null;
  const pair = (n, bound) => {
    const c = count(n);
    const b = count(bound);
    return { count: c, bound: b, full: c === null || b === null ? null : c >= b };
  };
  const refusedIndex = count(cards.refused_index_total);
  const refusedNewCard = count(cards.refused_new_card_total);
  const refusedXid = count(cards.refused_xid_total);
  const parts = [refusedIndex, refusedNewCard, refusedXid];
  return {
    registered: count(cards.registered_cards),
    known: count(cards.known_cards),
    newCards: pair(cards.new_cards_this_hour, cards.new_cards_per_hour),
    xidEvents: pair(cards.xid_events_this_hour, cards.xid_events_per_hour),
    xidPerBeat: count(cards.xid_events_per_beat),
    refusedIndex,
    refusedNewCard,
    refusedXid,
    refused: parts.includes(null) ? null : parts.reduce((a, b) => a + b, 0),
  };
}

/**
 * The vendor tools whose calls time out on the node: [{tool, since (null: unknown), timeouts (null: unknown)}];
 * an empty list when the node's last beat named none (the API's null).
 */
export function toolStalls(stalls) {
  if (!Array.isArray(stalls)) return [];
  return stalls
    .filter((s) => s && typeof s.tool === "string" && s.tool)
    .map((s) => ({ tool: s.tool, since: instant(s.since), timeouts: count(s.timeouts) }));
}
