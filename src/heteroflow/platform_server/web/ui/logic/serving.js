// The serving dashboard's pure logic: the state of each DP rank, the phase's meaning, which round to show, the
// evidence timeline's shape and the downloadable evidence document. Purely computational (no DOM, no fetch).
//
// Everything comes from the controller's status entry (RFC §7 keys) and its round records. Text is never built
// here: labels are dictionary keys with parameters, so both languages stay complete. A value the controller did
// not send stays unknown (null), never a guess.

/** The states a DP rank can be in, in the order of the legend. */
export const RANK_STATES = Object.freeze([
  "alive",
  "diagnosing",
  "unhealthy",
  "hw_fault",
  "dead",
  "withdrawn",
  "committed_dead",
  "unknown",
]);

/** The phases of ``serving-ft.md`` F-30, in the order of a round. */
export const PHASES = Object.freeze([
  "DISABLED",
  "NORMAL",
  "DECIDING",
  "WAITING_ENGINE_FAULT",
  "SCALING_DOWN",
  "POST_SCALE_CLEANUP",
  "SCALED_DOWN_RUNNING",
  "RECONFIGURING",
]);

/** Phases in which a scale-down round is running (a round's own phases). */
export const ROUND_PHASES = Object.freeze(["DECIDING", "WAITING_ENGINE_FAULT", "SCALING_DOWN", "POST_SCALE_CLEANUP"]);

/** Gate reason codes the dictionary explains (``engine-protocol.md``); any other code is shown as sent. */
export const GATE_REASONS = Object.freeze([
  "FEATURE_DISABLED",
  "ENGINE_FT_REQUIRED",
  "EXTERNAL_LB_REQUIRED",
  "AUTO_RECOVERY_CONFLICT",
  "ENGINE_SCALE_DOWN_UNSUPPORTED",
  "EPLB_REQUIRED",
  "EXPERT_REDUNDANCY_REQUIRED",
  "EXPERT_CAPACITY_INSUFFICIENT",
  "NO_SURVIVOR",
  "TOPOLOGY_INCOMPLETE",
  "CAPABILITY_MISMATCH",
  "ELASTIC_EP_RESIZED",
]);

// Steady phases have their own tone; every other known phase is a round at work ("busy").
const PHASE_TONES = Object.freeze({ DISABLED: "off", NORMAL: "ok", SCALED_DOWN_RUNNING: "ok", RECONFIGURING: "bad" });

const UNHEALTHY_STATUSES = new Set(["unhealthy", "protocol_error", "failed"]);

function rankSet(value) {
  return new Set(Array.isArray(value) ? value.filter(Number.isInteger) : []);
}

/**
 * One cell per original DP rank, ascending, with its state.
 *
 * Precedence, strongest first: committed dead (retired for good: never serves again) → withdrawn (in this
 * round's pending removal set, not committed yet) → dead (the engine or its supervisor said so; not committed)
 * → hardware fault (a card of the rank has a standing or a pending hardware fault: never shown alive)
 * → diagnosing (vLLM 0.34: a fault the engine is still diagnosing; it cannot take a command yet)
 * → unhealthy (the engine reports a fault; it may still recover) → alive (an active rank with no fault reported)
 * → unknown (the entry contradicts itself: not alive, yet neither dead nor pending).
 * @param {object} entry one element of GET /api/v1/serving/status
 * @returns {{rank: number, state: string, engine: string|null, published: boolean|null, faults: string[]}[]}
 */
export function rankCells(entry) {
  const committed = rankSet(entry.dead_committed);
  const pending = rankSet(entry.pending_removed_ranks);
  const alive = rankSet(entry.alive_dp_ranks);
  const statuses = entry.engine_statuses && typeof entry.engine_statuses === "object" ? entry.engine_statuses : {};
  const published = Array.isArray(entry.published_endpoints) ? rankSet(entry.published_endpoints) : null;
  const original = [...rankSet(entry.original_dp_ranks)].sort((a, b) => a - b);
  const faulted = hardwareRanks(entry);
  return original.map((rank) => {
    const raw = statuses[String(rank)];
    const engine = typeof raw === "string" ? raw : null;
    let state;
    if (committed.has(rank)) state = "committed_dead";
    else if (pending.has(rank)) state = "withdrawn";
    else if (engine === "dead") state = "dead";
    else if (faulted.has(rank)) state = "hw_fault";
    else if (engine === "diagnosing") state = "diagnosing";
    else if (engine !== null && UNHEALTHY_STATUSES.has(engine)) state = "unhealthy";
    else if (alive.has(rank)) state = "alive";
    else state = "unknown";
    const faults = faulted.get(rank) ?? [];
    return { rank, state, engine, published: published === null ? null : published.has(rank), faults };
  });
}

/** How many cells are in each state (every state present, 0 included: these are counted, not unknown). */
export function stateCounts(cells) {
  const counts = Object.fromEntries(RANK_STATES.map((s) => [s, 0]));
  for (const cell of cells) counts[cell.state] += 1;
  return counts;
}

/**
 * The phase's dictionary keys and its tone (for the badge colour; the words always go with it).
 * @param {string} phase
 * @returns {{name: string, explain: string, tone: "ok"|"busy"|"bad"|"off"|"unknown", known: boolean}}
 */
export function phaseInfo(phase) {
  if (!PHASES.includes(phase)) {
    return { name: "serving.phase.unknown", explain: "serving.phase.unknown.explain", tone: "unknown", known: false };
  }
  const tone = PHASE_TONES[phase] ?? "busy";
  return { name: `serving.phase.${phase}`, explain: `serving.phase.${phase}.explain`, tone, known: true };
}

/** Gate reason codes about what the engines can do: each also has a sentence saying why and what happens instead. */
export const GATE_ENGINE_REASONS = Object.freeze([
  "ENGINE_SCALE_DOWN_UNSUPPORTED",
  "CAPABILITY_MISMATCH",
  "ELASTIC_EP_RESIZED",
]);

/**
 * The gate's reason codes with the dictionary key that names each (null for a code the page does not know) and,
 * for the engine's own refusals, the key of the sentence that explains it (else null).
 */
export function gateReasons(entry) {
  const gate = entry.gate && typeof entry.gate === "object" ? entry.gate : {};
  const codes = Array.isArray(gate.reason_codes) ? gate.reason_codes.map(String) : [];
  return {
    allowed: gate.allowed === undefined ? null : Boolean(gate.allowed),
    reasons: codes.map((code) => ({
      code,
      key: GATE_REASONS.includes(code) ? `serving.gate.reason.${code}` : null,
      explain: GATE_ENGINE_REASONS.includes(code) ? `serving.gate.explain.${code}` : null,
    })),
    warnings: Array.isArray(gate.warnings) ? gate.warnings.map(String) : [],
  };
}

/** Fault-tolerance protocol profiles the dictionary explains (``engine-protocol.md``; ``mixed``: pods disagree). */
export const PROTOCOL_PROFILES = Object.freeze(["vllm-0.32", "vllm-0.34", "mixed"]);

/**
 * What the instance's engines can do (``engine_capability`` of the status entry): the protocol profile the
 * NodeManagers discovered (or that is pinned), with its dictionary key (``serving.engine.profile.none`` while
 * none is known, null for a profile the page does not know), and whether they can scale down and retry.
 * A flag the controller did not send stays unknown (null); no ``engine_capability`` at all gives null.
 * @returns {{profile: string|null, profileKey: string|null, scaleDown: boolean|null, retry: boolean|null}|null}
 */
export function engineCapability(entry) {
  const cap = entry?.engine_capability;
  if (!cap || typeof cap !== "object") return null;
  const profile = typeof cap.protocol_profile === "string" && cap.protocol_profile ? cap.protocol_profile : null;
  const flag = (v) => (typeof v === "boolean" ? v : null);
  let profileKey = null;
  if (profile === null) profileKey = "serving.engine.profile.none";
  else if (PROTOCOL_PROFILES.includes(profile)) profileKey = `serving.engine.profile.${profile}`;
  return { profile, profileKey, scaleDown: flag(cap.scale_down_supported), retry: flag(cap.retry_supported) };
}

/**
 * Which round's timeline to show: the one the user picked, else the newest round still running, else the newest
 * round of all (the last one).
 *
 * The status entry's ``request_id`` is not the current round: after a failed round it still names that round
 * while the fallback (a round record of its own, ``fb-…``) runs, and after a commit it names the committed round.
 * So the round summaries decide: the newest without an outcome is running. Only when the summaries do not yet
 * list the entry's round (it began between the two calls) does the entry's id stand in, while a round phase lasts.
 * @param {object} entry the instance's status entry
 * @param {object[]} rounds the instance's round summaries (oldest first, as the controller sends them)
 * @param {string|null} picked a request id the user selected
 * @returns {{requestId: string, running: boolean, picked: boolean}|null}
 */
export function roundToShow(entry, rounds, picked = null) {
  const list = Array.isArray(rounds) ? rounds.filter((r) => r && r.request_id) : [];
  const runningIds = new Set(list.filter((r) => r.outcome == null).map((r) => String(r.request_id)));
  if (picked) return { requestId: picked, running: runningIds.has(picked), picked: true };
  const newestRunning = [...list].reverse().find((r) => r.outcome == null);
  if (newestRunning) return { requestId: String(newestRunning.request_id), running: true, picked: false };
  const listed = new Set(list.map((r) => String(r.request_id)));
  if (entry.request_id && ROUND_PHASES.includes(entry.phase) && !listed.has(String(entry.request_id))) {
    return { requestId: String(entry.request_id), running: true, picked: false };
  }
  const last = list.at(-1);
  if (last) return { requestId: String(last.request_id), running: false, picked: false };
  if (entry.request_id) return { requestId: String(entry.request_id), running: isRunning(entry), picked: false };
  return null;
}

/**
 * A round's duration in seconds: the controller's ``round_total`` stage when it measured one (a committed
 * scale-down), else, for a finished round whose record is loaded, the time of its outcome event since the round
 * began (failed rounds, fallbacks, fast recoveries). A running round, or one whose record is not loaded, has no
 * duration yet (null), never 0.
 * @param {object} summary a round summary (or record)
 * @param {object|null} record the round's record with its events, when loaded
 * @returns {number|null}
 */
export function roundDuration(summary, record = null) {
  const total = summary?.stage_seconds?.round_total;
  if (typeof total === "number" && Number.isFinite(total)) return total;
  if (summary?.outcome == null) return null;
  const events = Array.isArray(record?.events) ? record.events : [];
  const outcome = [...events].reverse().find((e) => e && e.kind === "outcome" && typeof e.t_sec === "number");
  if (outcome) return outcome.t_sec;
  return null;
}

/** Decision reasons the dictionary explains (``DecisionReason`` of the controller's core). */
export const DECISION_REASONS = Object.freeze([
  "FEATURE_DISABLED",
  "HIGHER_PRIORITY",
  "STRATEGY_RUNNING",
  "NO_FAULT",
  "COLLECTING",
  "WAITING_FOR_DEAD",
  "STABILITY_WINDOW",
  "CORRELATION_WINDOW",
  "COLLECTION_TIMEOUT",
  "ALL_DEAD",
  "CORRELATION_EXPIRED",
  "HARDWARE_UNMAPPABLE",
  "INSTANCE_NOT_ACTIVE",
  "HARDWARE_ALREADY_COMMITTED",
  "COMPLETE_SNAPSHOT",
  "FAST_RECOVERY_APPLICABLE",
  "FAST_RECOVERY_FAILED",
]);

/** Decision kinds the dictionary names. */
export const DECISION_KINDS = Object.freeze([
  "no_action",
  "wait",
  "higher_priority",
  "fast_recovery",
  "scale_down",
  "reconfigure",
  "hardware_handled",
]);

/**
 * The controller's ``last_decision`` ("kind:REASON") as dictionary keys; a part the page does not know is kept
 * as sent (key null). ``null`` when there is no decision yet.
 * @returns {{raw: string, kind: string, reason: string, kindKey: string|null, reasonKey: string|null}|null}
 */
export function decisionInfo(lastDecision) {
  if (typeof lastDecision !== "string" || lastDecision === "") return null;
  const at = lastDecision.indexOf(":");
  const kind = at < 0 ? lastDecision : lastDecision.slice(0, at);
  const reason = at < 0 ? "" : lastDecision.slice(at + 1);
  return {
    raw: lastDecision,
    kind,
    reason,
    kindKey: DECISION_KINDS.includes(kind) ? `serving.decision.kind.${kind}` : null,
    reasonKey: DECISION_REASONS.includes(reason) ? `serving.decision.reason.${reason}` : null,
  };
}

/** Fallback strategies the dictionary explains (F-14). */
export const FALLBACK_STRATEGIES = Object.freeze(["InstanceReconfiguration", "EngineRelaunch", "ScaleP2D"]);

export function fallbackKey(strategy) {
  return FALLBACK_STRATEGIES.includes(strategy) ? `serving.fallback.${strategy}` : null;
}

/** How a hardware fault maps onto the instance (``MappingKind``). */
export const HARDWARE_MAPPINGS = Object.freeze(["MAPPED", "NOT_AFFECTED", "UNMAPPABLE"]);

/**
 * The hardware faults the controller has seen for the instance, each with its mapping's dictionary key.
 * @returns {{key: string, level: string|null, source: string|null, mapping: string, mappingKey: string|null,
 *            ranks: number[], reason: string, pending: boolean|null}[]}
 */
/** The controller's reason codes for a hardware fault's mapping (its ``reason`` is the English sentence). */
export const HARDWARE_REASONS = Object.freeze([
  "no_node_name",
  "node_not_in_instance",
  "node_level",
  "unknown_card_format",
  "endpoint_without_devices",
  "card_not_in_instance",
]);

export function hardwareFaults(entry) {
  const faults = Array.isArray(entry?.hardware_faults) ? entry.hardware_faults : [];
  return faults
    .filter((f) => f && typeof f === "object")
    .map((f) => {
      const mapping = String(f.mapping ?? "");
      return {
        key: String(f.key ?? ""),
        level: f.level == null ? null : String(f.level),
        source: f.source == null ? null : String(f.source),
        mapping,
        mappingKey: HARDWARE_MAPPINGS.includes(mapping) ? `serving.hw.mapping.${mapping}` : null,
        ranks: Array.isArray(f.ranks) ? f.ranks.filter(Number.isInteger) : [],
        reason: typeof f.reason === "string" ? f.reason : "",
        reasonKey: HARDWARE_REASONS.includes(f.reason_code) ? `serving.hw.reason.${f.reason_code}` : null,
        reasonSubject: typeof f.reason_subject === "string" ? f.reason_subject : "",
        pending: typeof f.pending === "boolean" ? f.pending : null,
      };
    });
}

/**
 * The GPU health page of one node, where its cards can be inspected (a deep link); with ``gpuIndex``, that card
 * is the one shown in the ECC chart. ``known`` is the node as the node list gives it ({id, source}, see
 * ``nodeDirectory``): with it the link names the card itself (``card=<node id>:<index>``) on the node's own source
 * (``source=simulated`` for a simulated node); without it (a node the list does not hold, or the list could not
 * be read) the link names the node and the page finds it.
 */
export function nodeLink(nodeName, gpuIndex = null, known = null) {
  const hasIndex = Number.isInteger(gpuIndex) && gpuIndex >= 0;
  const params = new URLSearchParams();
  if (known?.source === "simulated") params.set("source", "simulated");
  if (hasIndex && typeof known?.id === "string" && known.id) {
    params.set("card", `${known.id}:${gpuIndex}`);
  } else {
    params.set("node", String(nodeName));
    if (hasIndex) params.set("gpu", String(gpuIndex));
  }
  return `/nodes/gpu-health?${params.toString().replaceAll("+", "%20")}`;
}

/**
 * The node list's items (``GET /api/v1/nodes``) by name: name → {id, source}. A name held by two nodes (one per
 * source) is ambiguous and left out, so its links name the node and the GPU health page resolves it.
 * @returns {Map<string, {id: string, source: string}>}
 */
export function nodeDirectory(items) {
  const byName = new Map();
  const ambiguous = new Set();
  for (const n of Array.isArray(items) ? items : []) {
    if (!n || typeof n.name !== "string" || typeof n.id !== "string" || !n.name || !n.id) continue;
    if (byName.has(n.name)) ambiguous.add(n.name);
    byName.set(n.name, { id: n.id, source: n.source === "simulated" ? "simulated" : "real" });
  }
  for (const name of ambiguous) byName.delete(name);
  return byName;
}

/**
 * Where each DP rank runs, from the status's pods (``pods[].ranks``): rank → {pod, node (null: not reported),
 * gpuIndex (the card's index when the rank registered exactly one card with an index, else null), engineRank and
 * engineDpSize (the FT id and DP size its engine was launched with, when a relaunch without some ranks renumbered
 * it; null when it runs as itself or nobody said), elasticResized (elastic EP resized its engine's world outside
 * HeteroFlow: no scale-down until a relaunch) and elasticRequestedDpSize (the DP size that resize asked for; null
 * when not said)}.
 * @returns {Map<number, {pod: string, node: string|null, gpuIndex: number|null, engineRank: number|null,
 *            engineDpSize: number|null, elasticResized: boolean, elasticRequestedDpSize: number|null}>}
 */
export function rankPlaces(entry) {
  const places = new Map();
  const pods = Array.isArray(entry?.pods) ? entry.pods : [];
  for (const pod of pods) {
    if (!pod || typeof pod !== "object" || !Array.isArray(pod.ranks)) continue;
    const node = typeof pod.node_name === "string" && pod.node_name ? pod.node_name : null;
    for (const r of pod.ranks) {
      if (!r || !Number.isInteger(r.rank)) continue;
      const devices = Array.isArray(r.devices) ? r.devices : [];
      const index = devices.length === 1 && Number.isInteger(devices[0]?.index) ? devices[0].index : null;
      const renumbered =
        Number.isInteger(r.engine_rank) && Number.isInteger(r.engine_dp_size) && r.engine_rank !== r.rank;
      places.set(r.rank, {
        pod: String(pod.pod_id ?? ""),
        node,
        gpuIndex: index,
        engineRank: renumbered ? r.engine_rank : null,
        engineDpSize: renumbered ? r.engine_dp_size : null,
        elasticResized: r.elastic_ep_resized === true,
        elasticRequestedDpSize:
          r.elastic_ep_resized === true && Number.isInteger(r.elastic_ep_requested_dp_size)
            ? r.elastic_ep_requested_dp_size
            : null,
      });
    }
  }
  return places;
}

/**
 * The controller's INTERVENTION_REQUIRED: its whole-instance relaunch attempts are spent and it stopped retrying.
 * @returns {string|null} the controller's reason, or null while it still acts by itself
 */
export function interventionReason(entry) {
  const reason = entry.intervention_required;
  return typeof reason === "string" && reason.trim() !== "" ? reason : null;
}

/** How the controller's last fallback relaunched the instance when not in place (``RelaunchKind``). */
export const RELAUNCH_KINDS = Object.freeze(["REPLACE_PODS", "WITHOUT_RANKS", "REFUSED"]);

/** The controller's reason codes for a relaunch not in place (its ``reason`` is the English sentence). */
export const RELAUNCH_REASONS = Object.freeze([
  "standing_fault_pods_replaced",
  "standing_fault_ranks_left_out",
  "standing_fault_scale_down_refused",
  "standing_fault_every_rank",
  "relaunch_expert_capacity_insufficient",
]);

function intList(value) {
  return Array.isArray(value) ? value.filter(Number.isInteger) : [];
}

function stringList(value) {
  return Array.isArray(value) ? value.filter((v) => typeof v === "string") : [];
}

/**
 * Why the controller's last fallback did not relaunch every rank where it ran: ranks on cards with a standing
 * hardware fault were left out, their pods replaced, or nothing was relaunched (``refused``).
 * @returns {{kind: string, kindKey: string|null, refused: boolean, reason: string, reasonKey: string|null,
 *            ranks: number[], faults: string[], pods: string[], gateReasons: string[]}|null}
 */
export function relaunchInfo(entry) {
  const plan = entry?.relaunch;
  if (!plan || typeof plan !== "object") return null;
  const kind = String(plan.kind ?? "");
  return {
    kind,
    kindKey: RELAUNCH_KINDS.includes(kind) ? `serving.relaunch.kind.${kind}` : null,
    refused: kind === "REFUSED",
    reason: typeof plan.reason === "string" ? plan.reason : "",
    reasonKey: RELAUNCH_REASONS.includes(plan.reason_code) ? `serving.relaunch.reason.${plan.reason_code}` : null,
    ranks: intList(plan.ranks),
    faults: stringList(plan.faults),
    pods: stringList(plan.pods),
    gateReasons: stringList(plan.gate_reasons),
  };
}

/** The states of a restore to the configured size (the controller's ``restore.state``). */
export const RESTORE_STATES = Object.freeze(["running", "succeeded", "failed"]);

/**
 * The instance's last restore to its configured size and whether one may start now (``restore``,
 * ``restorable``: "ready" or the controller's reason why not; absent unless the instance runs scaled down).
 * @returns {{state: string, stateKey: string|null, ranks: number[], requestedBy: string, seconds: number|null,
 *            error: string|null, degradedPhase: string|null, requestId: string}|null} the last restore, or null
 */
export function restoreInfo(entry) {
  const last = entry?.restore;
  if (!last || typeof last !== "object") return null;
  const state = String(last.state ?? "");
  return {
    state,
    stateKey: RESTORE_STATES.includes(state) ? `serving.restore.state.${state}` : null,
    ranks: intList(last.ranks),
    requestedBy: typeof last.requested_by === "string" ? last.requested_by : "",
    seconds: Number.isFinite(last.seconds) ? last.seconds : null,
    error: typeof last.error === "string" ? last.error : null,
    degradedPhase: typeof last.degraded_phase === "string" ? last.degraded_phase : null,
    requestId: typeof last.request_id === "string" ? last.request_id : "",
  };
}

/**
 * Whether a scaled-down instance may be restored now: ``{ready: true}``, ``{ready: false, reason}``, or null
 * when the instance does not run scaled down (nothing to restore).
 */
export function restorable(entry) {
  const value = entry?.restorable;
  if (typeof value !== "string" || value === "") return null;
  return value === "ready" ? { ready: true, reason: "" } : { ready: false, reason: value };
}

/** A round is running in a round phase, or while the controller reports a running strategy. */
export function isRunning(entry) {
  return ROUND_PHASES.includes(entry.phase) || Boolean(entry.running_strategy);
}

/**
 * Past rounds, newest first; a summary without an outcome is still running.
 * @param {object[]} rounds the summaries, oldest first
 * @param {Map<string, object>|null} records loaded round records by request id (for the durations)
 */
export function pastRounds(rounds, records = null) {
  const list = Array.isArray(rounds) ? [...rounds] : [];
  return list.reverse().map((r) => ({
    requestId: String(r.request_id),
    kind: String(r.kind ?? ""),
    startedAt: r.started_at ?? null,
    outcome: r.outcome ?? null,
    tone: outcomeTone(r.outcome ?? null),
    totalSec: roundDuration(r, records?.get?.(String(r.request_id)) ?? null),
  }));
}

export function outcomeTone(outcome) {
  if (outcome === null || outcome === undefined) return "busy";
  if (outcome === "committed" || outcome === "succeeded" || outcome === "deduplicated") return "ok";
  if (outcome === "failed") return "bad";
  return "unknown";
}

/** "+1.234 s" from seconds since the round began; unknown stays unknown (null). */
export function relTime(seconds) {
  if (typeof seconds !== "number" || !Number.isFinite(seconds)) return null;
  return `+${seconds.toFixed(3)} s`;
}

const KNOWN_OUTCOMES = ["committed", "failed", "succeeded", "deduplicated"];
const list = (v) => (Array.isArray(v) && v.length ? v.join(", ") : "—");
const text = (v) => (v === null || v === undefined || v === "" ? "—" : String(v));

function pollEntries(entries) {
  if (!entries || typeof entries !== "object") return "—";
  const keys = Object.keys(entries).sort((a, b) => Number(a) - Number(b));
  return keys.length ? keys.map((k) => `${k}: ${entries[k]}`).join(" · ") : "—";
}

/**
 * One event as a timeline item: its dictionary key and parameters, a tone, and the raw detail worth showing
 * verbatim (an apply body). Unknown kinds are kept, labelled as such, with their whole detail.
 */
function shapeEvent(e) {
  const p = {};
  let key;
  let tone = "info";
  let body = null;
  switch (e.kind) {
    case "decided":
      key = e.hardware_matched ? "serving.tl.decided_hw" : "serving.tl.decided";
      Object.assign(p, { candidates: list(e.candidates), survivors: list(e.survivors), fallback: text(e.fallback) });
      break;
    case "write_ahead":
      key = "serving.tl.write_ahead";
      Object.assign(p, { what: text(e.what), phase: text(e.phase) });
      break;
    case "phase":
      key = "serving.tl.phase";
      Object.assign(p, { from: text(e.from), to: text(e.to) });
      tone = e.to === "RECONFIGURING" ? "bad" : e.to === "SCALED_DOWN_RUNNING" || e.to === "NORMAL" ? "ok" : "info";
      break;
    case "gate":
      key = e.allowed ? "serving.tl.gate_ok" : "serving.tl.gate_refused";
      p.reasons = list(e.reason_codes);
      tone = e.allowed ? "ok" : "bad";
      break;
    case "guard":
      key = e.renewed ? "serving.tl.guard_renewed" : "serving.tl.guard";
      Object.assign(p, { pod: text(e.pod_id), lease: text(e.lease_sec) });
      break;
    case "guard_failed":
    case "guard_renewal_failed":
    case "probe_failed":
    case "nudge_failed":
      key = `serving.tl.${e.kind}`;
      Object.assign(p, { pod: text(e.pod_id), error: text(e.error) });
      tone = "bad";
      break;
    case "status_poll":
      key = "serving.tl.status_poll";
      p.entries = pollEntries(e.entries);
      break;
    case "absorbed":
      key = "serving.tl.absorbed";
      p.ranks = list(e.ranks);
      tone = "warn";
      break;
    case "nudge":
      key = "serving.tl.nudge";
      Object.assign(p, { pod: text(e.pod_id), ok: text(e.ok) });
      break;
    case "coordinator_del":
    case "coordinator_add":
    case "coordinator_set":
      key = `serving.tl.${e.kind}`;
      p.endpoints = list(e.endpoint_ids);
      tone = e.kind === "coordinator_add" ? "ok" : "info";
      break;
    case "apply":
      key = e.http_status === null || e.http_status === undefined ? "serving.tl.apply_undelivered" : "serving.tl.apply";
      Object.assign(p, { pod: text(e.pod_id), status: text(e.http_status) });
      tone = e.http_status === 202 ? "ok" : "bad";
      body = e.body ?? null;
      break;
    case "probe":
      key = !e.ok ? "serving.tl.probe_bad" : e.identity_changed ? "serving.tl.probe_restarted" : "serving.tl.probe";
      Object.assign(p, {
        rank: text(e.endpoint_id),
        latency: typeof e.latency_sec === "number" ? e.latency_sec.toFixed(3) : "—",
      });
      tone = e.ok && !e.identity_changed ? "ok" : "bad";
      break;
    case "finalize":
      if (!e.commit) key = "serving.tl.finalize_abort";
      else key = e.repeated ? "serving.tl.finalize_commit_repeated" : "serving.tl.finalize_commit";
      Object.assign(p, { pod: text(e.pod_id), retired: list(e.retired) });
      tone = e.commit ? "ok" : "warn";
      break;
    case "finalize_failed":
      key = "serving.tl.finalize_failed";
      Object.assign(p, { pod: text(e.pod_id), error: text(e.error) });
      tone = "bad";
      break;
    case "pod_stop":
      key = e.ok ? "serving.tl.pod_stop" : "serving.tl.pod_stop_failed";
      Object.assign(p, { pod: text(e.pod_id), error: text(e.error) });
      tone = e.ok ? "info" : "warn";
      break;
    case "failed":
      key = "serving.tl.failed";
      p.error = text(e.error);
      tone = "bad";
      break;
    case "outcome":
      key = KNOWN_OUTCOMES.includes(e.outcome) ? `serving.tl.outcome.${e.outcome}` : "serving.tl.outcome";
      p.outcome = text(e.outcome);
      tone = outcomeTone(e.outcome);
      break;
    case "evidence":
      key = "serving.tl.evidence";
      Object.assign(p, { rank: text(e.endpoint_id), status: text(e.status), evidence: text(e.evidence), pod: text(e.pod_id) });
      tone = e.status === "dead" ? "bad" : "warn";
      break;
    case "hardware_fault":
      key = "serving.tl.hardware_fault";
      Object.assign(p, { key: text(e.key), level: text(e.level), mapping: text(e.mapping), ranks: list(e.ranks) });
      tone = "warn";
      break;
    case "fallback":
      key = "serving.tl.fallback";
      Object.assign(p, { strategy: text(e.strategy), reason: text(e.reason) });
      tone = "bad";
      break;
    case "fallback_failed":
      key = "serving.tl.fallback_failed";
      Object.assign(p, { attempt: text(e.attempt), error: text(e.error), retry: text(e.retry_in_sec) });
      tone = "bad";
      break;
    case "engines_restart":
      key = "serving.tl.engines_restart";
      Object.assign(p, { pod: text(e.pod_id), started: list(e.started), stopped: list(e.stopped) });
      break;
    case "engines_ready":
      key = "serving.tl.engines_ready";
      p.ranks = list(e.ranks);
      tone = "ok";
      break;
    case "ranks_left_out":
      key = "serving.tl.ranks_left_out";
      Object.assign(p, { ranks: list(e.ranks), faults: list(e.faults) });
      tone = "warn";
      break;
    case "pods_replaced":
      key = "serving.tl.pods_replaced";
      p.pods = list(e.pods);
      tone = "warn";
      break;
    default: {
      key = "serving.tl.other";
      p.kind = text(e.kind);
      const { at: _at, t_sec: _t, kind: _k, ...rest } = e;
      body = Object.keys(rest).length ? rest : null;
    }
  }
  return { kind: String(e.kind), key, params: p, tone, body };
}

/**
 * The round's events as a vertical timeline, oldest first, with times relative to the round's start.
 * Consecutive status polls with the same answers collapse into one item ("×N", first and last time), so a
 * 30-second wait does not bury the DEL and the apply under sixty identical lines.
 * @param {object} record GET /api/v1/serving/rounds/{request_id}
 * @returns {{kind: string, key: string, params: object, tone: string, body: any, at: string|null,
 *            t: number|null, rel: string|null, count: number, lastRel: string|null}[]}
 */
export function shapeTimeline(record) {
  const events = Array.isArray(record?.events) ? record.events : [];
  const succeeded = outcomeTone(record?.outcome ?? null) === "ok";
  const items = [];
  for (const e of events) {
    if (!e || typeof e !== "object") continue;
    const shaped = shapeEvent(e);
    // the reason a fallback started (an expired correlation, …) is no error once that path succeeded
    if (succeeded && shaped.kind === "fallback") shaped.tone = "warn";
    const t = typeof e.t_sec === "number" && Number.isFinite(e.t_sec) ? e.t_sec : null;
    const previous = items.at(-1);
    if (
      shaped.kind === "status_poll" &&
      previous &&
      previous.kind === "status_poll" &&
      previous.params.entries === shaped.params.entries
    ) {
      previous.count += 1;
      previous.lastRel = relTime(t);
      continue;
    }
    items.push({ ...shaped, at: typeof e.at === "string" ? e.at : null, t, rel: relTime(t), count: 1, lastRel: null });
  }
  return items;
}

/**
 * The downloadable evidence of one round: the controller's record verbatim plus what the page knew when it was
 * exported (the instance's status entry), so that a saved file stands on its own.
 * @returns {{filename: string, text: string}}
 */
export function evidenceDocument(record, entry, exportedAt) {
  const id = String(record?.request_id ?? "round");
  const doc = {
    exported_at: exportedAt,
    source: `/api/v1/serving/rounds/${id}`,
    round: record,
    instance_status: entry ?? null,
  };
  return { filename: `heteroflow-round-${id.replace(/[^A-Za-z0-9._-]/g, "_")}.json`, text: `${JSON.stringify(doc, null, 2)}\n` };
}

// ---- the round's story: its trigger, what clients saw, its absolute times ------------------------------------

/** The keys of the faults each rank's cards have (standing, or pending with a mapping onto the rank). */
export function hardwareRanks(entry) {
  const found = new Map();
  const add = (rank, key) => {
    if (!Number.isInteger(rank)) return;
    const list = found.get(rank) ?? [];
    if (!list.includes(key)) list.push(key);
    found.set(rank, list);
  };
  for (const f of hardwareFaults(entry)) {
    if (f.mapping === "MAPPED" && f.pending !== false) for (const rank of f.ranks) add(rank, f.key);
  }
  const standing = stringList(entry?.standing_hardware_faults);
  if (standing.length) {
    // a standing fault's key is "code|card|node": the rank whose registered card (id or index) is on that node
    const pods = Array.isArray(entry?.pods) ? entry.pods : [];
    for (const key of standing) {
      const [, card = "", node = ""] = key.split("|");
      for (const pod of pods) {
        if (!pod || pod.node_name !== node || !Array.isArray(pod.ranks)) continue;
        for (const r of pod.ranks) {
          const devices = Array.isArray(r?.devices) ? r.devices : [];
          if (card === "" || devices.some((d) => d && (d.device_id === card || String(d.index) === card))) add(r.rank, key);
        }
      }
    }
    const plan = entry?.relaunch;
    if (plan && typeof plan === "object") {
      for (const key of stringList(plan.faults)) if (standing.includes(key)) for (const rank of intList(plan.ranks)) add(rank, key);
    }
  }
  return found;
}

/** The moments a round keeps as absolute times, in order (the controller's ``times``). */
export const ROUND_TIMES = Object.freeze(["fault_at", "decided_at", "committed_at", "serving_resumed_at"]);

/** What clients saw, in the order shown (the Coordinator's counts). */
export const CLIENT_COUNTS = Object.freeze(["held", "rerouted", "resumed", "failed"]);

const isoOrNull = (v) => (typeof v === "string" && !Number.isNaN(new Date(v).getTime()) ? v : null);
const countOrNull = (v) => (Number.isInteger(v) && v >= 0 ? v : null);

/**
 * A round record's story: why it started (``trigger``: null when the controller kept none), what its clients
 * saw (``clients``: null while not asked; ``clientsError`` when the Coordinator could not be asked) and its
 * absolute times (each null until it came).
 */
export function roundStory(record) {
  const tr = record?.trigger && typeof record.trigger === "object" ? record.trigger : null;
  const trigger =
    tr === null
      ? null
      : {
          reason: typeof tr.reason === "string" ? tr.reason : null,
          reasonKey: DECISION_REASONS.includes(tr.reason) ? `serving.decision.reason.${tr.reason}` : null,
          decision: typeof tr.decision === "string" ? tr.decision : null,
          ranks: (Array.isArray(tr.ranks) ? tr.ranks : [])
            .filter((row) => row && Number.isInteger(row.rank))
            .map((row) => ({
              rank: row.rank,
              health: typeof row.health === "string" ? row.health : null,
              engine: typeof row.engine === "string" ? row.engine : null,
              evidence: typeof row.evidence === "string" ? row.evidence : null,
              firstSeenAt: isoOrNull(row.first_seen_at),
            })),
          hardware: (Array.isArray(tr.hardware) ? tr.hardware : [])
            .filter((hw) => hw && typeof hw.key === "string")
            .map((hw) => ({
              key: hw.key,
              level: Number.isInteger(hw.level) ? hw.level : null,
              mapping: typeof hw.mapping === "string" ? hw.mapping : null,
              ranks: intList(hw.ranks),
              standing: hw.standing === true,
            })),
        };
  const c = record?.clients && typeof record.clients === "object" ? record.clients : null;
  let clients = null;
  let clientsError = null;
  if (c !== null && typeof c.error === "string" && c.error) clientsError = c.error;
  else if (c !== null) {
    clients = Object.fromEntries(CLIENT_COUNTS.map((k) => [k, countOrNull(c[k])]));
    clients.longestWaitSec = typeof c.longest_wait_sec === "number" && Number.isFinite(c.longest_wait_sec) ? c.longest_wait_sec : null;
    clients.complete = c.complete !== false;
    clients.asOf = isoOrNull(c.as_of);
  }
  const t = record?.times && typeof record.times === "object" ? record.times : {};
  const times = ROUND_TIMES.map((name) => ({ name, at: isoOrNull(t[name]) }));
  return { trigger, clients, clientsError, times };
}

/** The trigger's row of ``rank`` when the decision saw it faulted (the cause a committed rank keeps), else null. */
export function rankCause(record, rank) {
  const story = roundStory(record);
  const row = story.trigger?.ranks.find((r) => r.rank === rank);
  return row && row.health && row.health !== "healthy" ? row : null;
}

/**
 * The controller's last error needs no action when the newest round after it succeeded and the instance serves
 * (an expired correlation whose fallback relaunched the instance is history, not an error): that round's id.
 */
export function resolvedBy(entry, rounds) {
  if (!entry?.last_error || entry.can_serve !== true || entry.serving_published === false) return null;
  const list = Array.isArray(rounds) ? rounds.filter((r) => r && r.request_id) : [];
  const newest = list.at(-1);
  if (!newest || outcomeTone(newest.outcome ?? null) !== "ok") return null;
  return String(newest.request_id);
}

/**
 * The platform server's 503 sentences about the controller, as dictionary keys with their parameters (the
 * server speaks English; the page speaks the reader's language). Null for a sentence the page does not know.
 */
export function controllerReason(detail) {
  const text = typeof detail === "string" ? detail : "";
  let m;
  if (text.startsWith("no controller configured")) return { key: "serving.ctl503.unconfigured", params: {} };
  if ((m = /^the controller at (\S+) did not answer within ([\d.]+) s/.exec(text))) {
    return { key: "serving.ctl503.timeout", params: { url: m[1], sec: m[2] } };
  }
  if ((m = /^the controller at (\S+) is unreachable \((.*)\)$/s.exec(text))) {
    return { key: "serving.ctl503.unreachable", params: { url: m[1], error: m[2] } };
  }
  if ((m = /^the controller refused this server's cluster token \(HTTP (\d+)\)/.exec(text))) {
    return { key: "serving.ctl503.token", params: { status: m[1] } };
  }
  if ((m = /^the controller answered HTTP (\d+)(?:: (.*))?$/s.exec(text))) {
    return m[2]
      ? { key: "serving.ctl503.status_detail", params: { status: m[1], detail: m[2] } }
      : { key: "serving.ctl503.status", params: { status: m[1] } };
  }
  if (text.startsWith("the controller's answer is not JSON")) return { key: "serving.ctl503.not_json", params: {} };
  return null;
}
