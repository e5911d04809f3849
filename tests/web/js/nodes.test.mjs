import { test } from "node:test";
import assert from "node:assert/strict";
import { LANGUAGES } from "../../../src/heteroflow/platform_server/web/ui/i18n.js";
import { cardsInfo, credentialInfo, toolStalls } from "../../../src/heteroflow/platform_server/web/ui/logic/nodes.js";

const CARDS = {
  registered_cards: 8,
  known_cards: 7,
  new_cards_this_hour: 2,
  new_cards_per_hour: 2,
  xid_events_this_hour: 5,
  xid_events_per_hour: 100,
  xid_events_per_beat: 32,
  refused_index_total: 0,
  refused_new_card_total: 3,
  refused_xid_total: 1,
};

test("a node's credential: its state, whether it was reissued, and when", () => {
  assert.deepEqual(
    credentialInfo({ state: "issued", issued_at: "2026-12-07T10:00:00Z", reissued: true, released_at: null }),
    { state: "issued", reissued: true, issuedAt: "2026-12-07T10:00:00Z", releasedAt: null },
  );
  assert.equal(credentialInfo({ state: "released", released_at: "2026-12-07T11:00:00Z" }).releasedAt, "2026-12-07T11:00:00Z");
  assert.equal(credentialInfo({ state: "none", reissued: "yes" }).reissued, null); // not a boolean: unknown
  assert.equal(credentialInfo({ state: "issued", issued_at: "not a time" }).issuedAt, null);
  for (const odd of [null, undefined, {}, { state: "stolen" }, "issued"]) assert.equal(credentialInfo(odd), null);
});

test("a node's card bounds: counts against their bounds, refusals summed, unknown never 0", () => {
  const info = cardsInfo(CARDS);
  assert.equal(info.registered, 8);
  assert.equal(info.known, 7);
  assert.deepEqual(info.newCards, { count: 2, bound: 2, full: true });
  assert.deepEqual(info.xidEvents, { count: 5, bound: 100, full: false });
  assert.equal(info.xidPerBeat, 32);
  assert.equal(info.refused, 4);
  // a missing or odd count is unknown, and so is any sum or comparison it enters
  const odd = cardsInfo({ ...CARDS, known_cards: null, xid_events_per_hour: -1, refused_xid_total: "1" });
  assert.equal(odd.known, null);
  assert.deepEqual(odd.xidEvents, { count: 5, bound: null, full: null });
  assert.equal(odd.refusedXid, null);
  assert.equal(odd.refused, null);
  assert.equal(cardsInfo(null), null);
  assert.equal(cardsInfo(undefined), null);
});

test("a node's stalled vendor tools; none named is an empty list", () => {
  assert.deepEqual(toolStalls([{ tool: "nvidia-smi", since: "2026-12-07T09:00:00Z", timeouts: 4 }, { tool: "nvml", since: "x", timeouts: null }, { since: "2026-12-07T09:00:00Z" }]), [
    { tool: "nvidia-smi", since: "2026-12-07T09:00:00Z", timeouts: 4 },
    { tool: "nvml", since: null, timeouts: null },
  ]);
  assert.deepEqual(toolStalls(null), []);
});

test("the nodes page's facts read in English and Chinese alike", () => {
  const keys = Object.keys(LANGUAGES.en).filter((k) => /^nodes\.(cred|cards|stalls|facts)/.test(k));
  assert.ok(keys.length >= 15, keys.length);
  for (const key of keys) {
    assert.ok(LANGUAGES.zh[key], key);
    assert.notEqual(LANGUAGES.zh[key], LANGUAGES.en[key], key);
    const holes = (text) => [...text.matchAll(/\{([a-z_]+)\}/g)].map((m) => m[1]).sort();
    assert.deepEqual(holes(LANGUAGES.zh[key]), holes(LANGUAGES.en[key]), key);
  }
});
