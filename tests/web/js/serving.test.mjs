import { test } from "node:test";
import assert from "node:assert/strict";
import { LANGUAGES } from "../../../src/heteroflow/platform_server/web/ui/i18n.js";
import {
  DECISION_KINDS,
  DECISION_REASONS,
  FALLBACK_STRATEGIES,
  GATE_ENGINE_REASONS,
  GATE_REASONS,
  HARDWARE_MAPPINGS,
  HARDWARE_REASONS,
  PHASES,
  PROTOCOL_PROFILES,
  RANK_STATES,
  decisionInfo,
  engineCapability,
  evidenceDocument,
  fallbackKey,
  gateReasons,
  hardwareFaults,
  interventionReason,
  isRunning,
  nodeDirectory,
  nodeLink,
  pastRounds,
  phaseInfo,
  rankCells,
  rankPlaces,
  relTime,
  relaunchInfo,
  roundDuration,
  roundToShow,
  shapeTimeline,
  stateCounts,
  controllerReason,
  shapeTimeline as shapeTimelineOf,
  rankCause,
  resolvedBy,
  roundStory,
} from "../../../src/heteroflow/platform_server/web/ui/logic/serving.js";

const entry = (over = {}) => ({
  instance_id: "inst-1",
  phase: "NORMAL",
  original_dp_ranks: [0, 1, 2, 3],
  request_id: null,
  dead_committed: [],
  pending_removed_ranks: [],
  alive_dp_ranks: [0, 1, 2, 3],
  fallback_strategy: null,
  gate: { allowed: true, reason_codes: [], warnings: [] },
  engine_statuses: {},
  serving_published: true,
  last_error: null,
  can_serve: true,
  published_endpoints: [0, 1, 2, 3],
  running_strategy: null,
  ...over,
});
const states = (e) => rankCells(e).map((c) => c.state);

// ---- state per rank ------------------------------------------------------------------------------------------
test("every rank of a healthy instance is alive and published", () => {
  const cells = rankCells(entry());
  assert.deepEqual(cells.map((c) => c.rank), [0, 1, 2, 3]);
  assert.deepEqual(states(entry()), ["alive", "alive", "alive", "alive"]);
  assert.ok(cells.every((c) => c.published === true && c.engine === null));
});

test("after a committed round: the committed rank is committed dead, never alive again", () => {
  const e = entry({
    phase: "SCALED_DOWN_RUNNING",
    dead_committed: [1],
    alive_dp_ranks: [0, 2, 3],
    published_endpoints: [0, 2, 3],
    engine_statuses: { 0: "healthy", 1: "dead", 2: "healthy", 3: "healthy" },
  });
  assert.deepEqual(states(e), ["alive", "committed_dead", "alive", "alive"]);
  assert.equal(rankCells(e)[1].published, false);
  assert.equal(rankCells(e)[0].engine, "healthy");
});

test("during a round: pending removal is withdrawn, an uncommitted DEAD is dead, a fault is unhealthy", () => {
  const e = entry({
    phase: "SCALING_DOWN",
    dead_committed: [0],
    pending_removed_ranks: [1],
    alive_dp_ranks: [2, 3, 4, 5, 6],
    original_dp_ranks: [0, 1, 2, 3, 4, 5, 6],
    engine_statuses: { 1: "dead", 2: "unhealthy", 3: "dead", 4: "protocol_error", 5: "healthy", 6: "diagnosing" },
  });
  assert.deepEqual(states(e), ["committed_dead", "withdrawn", "unhealthy", "dead", "unhealthy", "alive", "diagnosing"]);
});

test("a rank the entry contradicts itself about is unknown, never guessed alive", () => {
  const e = entry({ alive_dp_ranks: [0, 1, 2] });
  assert.deepEqual(states(e), ["alive", "alive", "alive", "unknown"]);
});

test("an entry without a published view (restored, not yet assembled) has published unknown", () => {
  const e = entry({ published_endpoints: undefined });
  assert.ok(rankCells(e).every((c) => c.published === null));
});

test("ranks are sorted numerically and junk values are ignored", () => {
  const e = entry({ original_dp_ranks: [10, 2, "x", 1], alive_dp_ranks: [1, 2, 10] });
  assert.deepEqual(rankCells(e).map((c) => c.rank), [1, 2, 10]);
});

test("state counts include zeros (counted, not unknown)", () => {
  const counts = stateCounts(rankCells(entry({ dead_committed: [3], alive_dp_ranks: [0, 1, 2] })));
  assert.deepEqual(counts, {
    alive: 3,
    diagnosing: 0,
    unhealthy: 0,
    hw_fault: 0,
    dead: 0,
    withdrawn: 0,
    committed_dead: 1,
    unknown: 0,
  });
});

// ---- phase text ------------------------------------------------------------------------------------------------
test("every phase has a name and a plain-language explanation in both languages", () => {
  for (const phase of PHASES) {
    const info = phaseInfo(phase);
    assert.equal(info.known, true);
    for (const lang of ["en", "zh"]) {
      assert.ok(LANGUAGES[lang][info.name], `${lang} ${info.name}`);
      assert.ok(LANGUAGES[lang][info.explain].length > 20, `${lang} ${info.explain}`);
    }
  }
  assert.equal(phaseInfo("NORMAL").tone, "ok");
  assert.equal(phaseInfo("SCALED_DOWN_RUNNING").tone, "ok");
  assert.equal(phaseInfo("RECONFIGURING").tone, "bad");
  assert.equal(phaseInfo("WAITING_ENGINE_FAULT").tone, "busy");
  assert.equal(phaseInfo("DISABLED").tone, "off");
});

test("an unknown phase is shown as unknown, not mapped to a known one", () => {
  const info = phaseInfo("SOMETHING_NEW");
  assert.equal(info.known, false);
  assert.equal(info.name, "serving.phase.unknown");
});

test("the gate's reason codes are explained when known and kept verbatim otherwise", () => {
  const gate = gateReasons(
    entry({ gate: { allowed: false, reason_codes: ["EPLB_REQUIRED", "NEW_CODE"], warnings: ["capacity 6 < 8"] } }),
  );
  assert.equal(gate.allowed, false);
  assert.deepEqual(gate.reasons, [
    { code: "EPLB_REQUIRED", key: "serving.gate.reason.EPLB_REQUIRED", explain: null },
    { code: "NEW_CODE", key: null, explain: null },
  ]);
  assert.deepEqual(gate.warnings, ["capacity 6 < 8"]);
  assert.equal(gateReasons({}).allowed, null);
  for (const code of GATE_REASONS) assert.ok(LANGUAGES.zh[`serving.gate.reason.${code}`], code);
});

test("the engine's own refusals come with a sentence in both languages", () => {
  const gate = gateReasons(
    entry({ gate: { allowed: false, reason_codes: ["FEATURE_DISABLED", "ENGINE_SCALE_DOWN_UNSUPPORTED", "CAPABILITY_MISMATCH"] } }),
  );
  assert.deepEqual(
    gate.reasons.map((r) => r.explain),
    [null, "serving.gate.explain.ENGINE_SCALE_DOWN_UNSUPPORTED", "serving.gate.explain.CAPABILITY_MISMATCH"],
  );
  assert.deepEqual(GATE_ENGINE_REASONS, ["ENGINE_SCALE_DOWN_UNSUPPORTED", "CAPABILITY_MISMATCH", "ELASTIC_EP_RESIZED"]);
  for (const code of GATE_ENGINE_REASONS) {
    const key = `serving.gate.explain.${code}`;
    assert.ok(GATE_REASONS.includes(code), code);
    assert.ok(LANGUAGES.en[key] && LANGUAGES.zh[key], key);
    assert.notEqual(LANGUAGES.zh[key], LANGUAGES.en[key], key);
  }
  assert.match(LANGUAGES.en["serving.gate.explain.ENGINE_SCALE_DOWN_UNSUPPORTED"], /scale_down/);
  assert.match(LANGUAGES.zh["serving.gate.explain.ENGINE_SCALE_DOWN_UNSUPPORTED"], /缩容/);
});

test("the engines' capability: the discovered profile and what it can do, unknown never guessed", () => {
  const released = { protocol_profile: "vllm-0.32", scale_down_supported: false, retry_supported: true };
  assert.deepEqual(engineCapability(entry({ engine_capability: released })), {
    profile: "vllm-0.32",
    profileKey: "serving.engine.profile.vllm-0.32",
    scaleDown: false,
    retry: true,
  });
  const undiscovered = { protocol_profile: null, scale_down_supported: true, retry_supported: true };
  assert.deepEqual(engineCapability(entry({ engine_capability: undiscovered })), {
    profile: null,
    profileKey: "serving.engine.profile.none",
    scaleDown: true,
    retry: true,
  });
  const future = engineCapability(entry({ engine_capability: { protocol_profile: "vllm-0.40" } }));
  assert.deepEqual(future, { profile: "vllm-0.40", profileKey: null, scaleDown: null, retry: null });
  assert.equal(engineCapability(entry()), null); // a restored instance not assembled yet sends none
  assert.equal(engineCapability(entry({ engine_capability: "vllm" })), null);
  const keys = ["profile", "profile.none", "scale_down", "retry", "supported", "unsupported"];
  for (const name of [...keys, ...PROTOCOL_PROFILES.map((p) => `profile.${p}`)]) {
    const key = `serving.engine.${name}`;
    assert.ok(LANGUAGES.en[key] && LANGUAGES.zh[key], key);
  }
});

test("every rank state has a name and an explanation", () => {
  for (const s of RANK_STATES) {
    assert.ok(LANGUAGES.en[`serving.state.${s}`] && LANGUAGES.en[`serving.state.${s}.explain`], s);
  }
});

// ---- which round ------------------------------------------------------------------------------------------------
test("the running round is shown while it runs; afterwards the newest one", () => {
  const rounds = [{ request_id: "sd-old", outcome: "committed" }];
  const now = [...rounds, { request_id: "sd-now", outcome: null }];
  assert.deepEqual(roundToShow(entry({ phase: "SCALING_DOWN", request_id: "sd-now" }), now), {
    requestId: "sd-now",
    running: true,
    picked: false,
  });
  // the round began between the status call and the rounds call: the entry's id stands in while a round phase lasts
  assert.deepEqual(roundToShow(entry({ phase: "SCALING_DOWN", request_id: "sd-now" }), rounds), {
    requestId: "sd-now",
    running: true,
    picked: false,
  });
  const done = [...rounds, { request_id: "sd-now", outcome: "committed" }];
  assert.deepEqual(roundToShow(entry({ phase: "SCALED_DOWN_RUNNING", request_id: "sd-now" }), done), {
    requestId: "sd-now",
    running: false,
    picked: false,
  });
  assert.deepEqual(roundToShow(entry(), rounds), { requestId: "sd-old", running: false, picked: false });
  assert.equal(roundToShow(entry(), []), null);
  assert.deepEqual(roundToShow(entry(), [], "sd-x"), { requestId: "sd-x", running: false, picked: true });
  assert.equal(roundToShow(entry(), now, "sd-now").running, true);
  assert.equal(isRunning(entry({ phase: "RECONFIGURING", running_strategy: "fallback" })), true);
  assert.equal(isRunning(entry({ phase: "RECONFIGURING" })), false);
});

test("INTERVENTION_REQUIRED shows only while the controller reports a reason", () => {
  const reason = "INTERVENTION_REQUIRED: 3 whole-instance relaunches within 1800 s, the limit: the instance keeps failing, and the controller stopped relaunching it";
  assert.equal(interventionReason(entry({ phase: "RECONFIGURING", intervention_required: reason })), reason);
  assert.equal(interventionReason(entry({ phase: "RECONFIGURING", intervention_required: null })), null);
  assert.equal(interventionReason(entry({ phase: "RECONFIGURING", intervention_required: "  " })), null);
  assert.equal(interventionReason(entry({ phase: "NORMAL" })), null);
});

test("after a failed round the fallback is the current round, not the failed one the entry still names", () => {
  const rounds = [
    { request_id: "sd-1", kind: "scale_down", outcome: "failed" },
    { request_id: "fb-1", kind: "fallback", outcome: null },
  ];
  const reconfiguring = entry({ phase: "RECONFIGURING", request_id: "sd-1", running_strategy: "scale_down" });
  assert.deepEqual(roundToShow(reconfiguring, rounds), { requestId: "fb-1", running: true, picked: false });
  // the fallback succeeded: the entry is back to NORMAL, still naming sd-1; the newest round is the last one
  const succeeded = [rounds[0], { ...rounds[1], outcome: "succeeded" }];
  assert.deepEqual(roundToShow(entry({ request_id: "sd-1" }), succeeded), {
    requestId: "fb-1",
    running: false,
    picked: false,
  });
});

test("every round kind has a duration once finished: round_total, else the outcome's time", () => {
  const failed = { request_id: "sd-2", outcome: "failed", stage_seconds: { guard: 0.1 } };
  const events = [
    { kind: "decided", t_sec: 0 },
    { kind: "failed", t_sec: 2.25, error: "x" },
    { kind: "outcome", t_sec: 2.5, outcome: "failed" },
  ];
  assert.equal(roundDuration(failed, { ...failed, events }), 2.5);
  assert.equal(roundDuration(failed, null), null); // not loaded: unknown, never 0
  assert.equal(roundDuration({ outcome: "committed", stage_seconds: { round_total: 1.5 } }), 1.5);
  assert.equal(roundDuration({ outcome: null, stage_seconds: {} }, { events }), null); // still running
  const fallback = { request_id: "fb-2", kind: "fallback", outcome: "succeeded", stage_seconds: {} };
  const list = pastRounds([fallback], new Map([["fb-2", { ...fallback, events: [{ kind: "outcome", t_sec: 7 }] }]]));
  assert.equal(list[0].totalSec, 7);
});

test("the last decision is explained in both languages; an unknown part is kept as sent", () => {
  for (const reason of DECISION_REASONS) {
    const info = decisionInfo(`reconfigure:${reason}`);
    assert.equal(info.reasonKey, `serving.decision.reason.${reason}`);
    for (const lang of ["en", "zh"]) assert.ok(LANGUAGES[lang][info.reasonKey], `${lang} ${reason}`);
  }
  for (const kind of DECISION_KINDS) {
    for (const lang of ["en", "zh"]) assert.ok(LANGUAGES[lang][`serving.decision.kind.${kind}`], `${lang} ${kind}`);
  }
  const odd = decisionInfo("later:SOMETHING_NEW");
  assert.deepEqual([odd.kindKey, odd.reasonKey, odd.kind, odd.reason], [null, null, "later", "SOMETHING_NEW"]);
  assert.equal(decisionInfo(null), null);
  assert.equal(decisionInfo("no_action").reason, "");
});

test("hardware faults carry their mapping's sentence; fallbacks theirs", () => {
  const faults = hardwareFaults(
    entry({
      hardware_faults: [
        { key: "k1", level: "L2", source: "platform", mapping: "MAPPED", ranks: [2, 3], reason: "node-level fault", reason_code: "node_level", pending: true },
        { key: "k2", mapping: "SOMETHING", ranks: "x", reason: "from an older controller" },
        { key: "k3", mapping: "NOT_AFFECTED", reason: "no endpoint of the instance uses 'GPU-9'", reason_code: "card_not_in_instance", reason_subject: "GPU-9" },
        null,
      ],
    }),
  );
  assert.deepEqual(
    faults.map((f) => [f.key, f.mappingKey, f.ranks, f.pending, f.reasonKey, f.reasonSubject, f.reason]),
    [
      ["k1", "serving.hw.mapping.MAPPED", [2, 3], true, "serving.hw.reason.node_level", "", "node-level fault"],
      ["k2", null, [], null, null, "", "from an older controller"],
      ["k3", "serving.hw.mapping.NOT_AFFECTED", [], null, "serving.hw.reason.card_not_in_instance", "GPU-9", "no endpoint of the instance uses 'GPU-9'"],
    ],
  );
  for (const r of HARDWARE_REASONS) for (const lang of ["en", "zh"]) assert.ok(LANGUAGES[lang][`serving.hw.reason.${r}`]);
  for (const m of HARDWARE_MAPPINGS) for (const lang of ["en", "zh"]) assert.ok(LANGUAGES[lang][`serving.hw.mapping.${m}`]);
  for (const f of FALLBACK_STRATEGIES) for (const lang of ["en", "zh"]) assert.ok(LANGUAGES[lang][fallbackKey(f)]);
  assert.equal(fallbackKey("Other"), null);
  assert.equal(nodeLink("sim local/01"), "/nodes/gpu-health?node=sim%20local%2F01");
  assert.deepEqual(hardwareFaults(entry()), []);
});

test("past rounds come newest first with their outcome's tone; no outcome means running", () => {
  const list = pastRounds([
    { request_id: "a", kind: "scale_down", outcome: "failed", stage_seconds: {} },
    { request_id: "b", kind: "scale_down", outcome: "committed", stage_seconds: { round_total: 1.5 } },
    { request_id: "c", kind: "fallback", outcome: null, stage_seconds: {} },
  ]);
  assert.deepEqual(
    list.map((r) => [r.requestId, r.tone, r.totalSec]),
    [
      ["c", "busy", null],
      ["b", "ok", 1.5],
      ["a", "bad", null],
    ],
  );
});

// ---- timeline shaping -------------------------------------------------------------------------------------------
const record = {
  request_id: "sd-1",
  kind: "scale_down",
  outcome: "committed",
  events: [
    { at: "t", t_sec: 0, kind: "decided", candidates: [1], survivors: [0, 2, 3], fallback: "InstanceReconfiguration" },
    { at: "t", t_sec: 0.01, kind: "phase", from: "NORMAL", to: "DECIDING" },
    { at: "t", t_sec: 0.02, kind: "gate", allowed: true, reason_codes: [], warnings: [] },
    { at: "t", t_sec: 0.03, kind: "guard", pod_id: "pod-a", lease_sec: 90, renewed: false },
    { at: "t", t_sec: 0.1, kind: "status_poll", entries: { 0: "healthy", 2: "healthy" } },
    { at: "t", t_sec: 0.2, kind: "status_poll", entries: { 0: "healthy", 2: "healthy" } },
    { at: "t", t_sec: 0.3, kind: "status_poll", entries: { 0: "healthy", 2: "healthy" } },
    { at: "t", t_sec: 0.4, kind: "status_poll", entries: { 2: "unhealthy", 0: "unhealthy" } },
    { at: "t", t_sec: 0.5, kind: "coordinator_del", endpoint_ids: [0, 1, 2, 3] },
    {
      at: "t",
      t_sec: 0.6,
      kind: "apply",
      pod_id: "pod-a",
      http_status: 202,
      body: { instruction: "scale_down", params: { removed_dp_ranks: [1] } },
    },
    { at: "t", t_sec: 0.61, kind: "apply", pod_id: "pod-b", http_status: 409, body: {} },
    { at: "t", t_sec: 0.62, kind: "apply", pod_id: "pod-c", http_status: null, body: {} },
    { at: "t", t_sec: 0.7, kind: "probe", endpoint_id: 0, ok: true, latency_sec: 0.0123, identity_changed: false },
    { at: "t", t_sec: 0.71, kind: "probe", endpoint_id: 2, ok: true, latency_sec: 0.02, identity_changed: true },
    { at: "t", t_sec: 0.8, kind: "finalize", pod_id: "pod-a", commit: true, repeated: false, retired: [1] },
    { at: "t", t_sec: 0.81, kind: "finalize", pod_id: "pod-b", commit: false, repeated: false },
    { at: "t", t_sec: 0.9, kind: "coordinator_add", endpoint_ids: [0, 2, 3] },
    { at: "t", t_sec: 1.0, kind: "outcome", outcome: "committed" },
    { at: "t", t_sec: 1.1, kind: "brand_new_event", what: 1 },
  ],
};

test("the timeline keeps order, relative times and the right labels", () => {
  const items = shapeTimeline(record);
  assert.deepEqual(
    items.map((i) => i.key),
    [
      "serving.tl.decided",
      "serving.tl.phase",
      "serving.tl.gate_ok",
      "serving.tl.guard",
      "serving.tl.status_poll",
      "serving.tl.status_poll",
      "serving.tl.coordinator_del",
      "serving.tl.apply",
      "serving.tl.apply",
      "serving.tl.apply_undelivered",
      "serving.tl.probe",
      "serving.tl.probe_restarted",
      "serving.tl.finalize_commit",
      "serving.tl.finalize_abort",
      "serving.tl.coordinator_add",
      "serving.tl.outcome.committed",
      "serving.tl.other",
    ],
  );
  assert.equal(items[0].rel, "+0.000 s");
  assert.deepEqual(items[0].params, { candidates: "1", survivors: "0, 2, 3", fallback: "InstanceReconfiguration" });
  assert.equal(items.at(-1).params.kind, "brand_new_event");
  assert.deepEqual(items.at(-1).body, { what: 1 });
});

test("identical consecutive polls collapse into one item with a count; a change starts a new one", () => {
  const polls = shapeTimeline(record).filter((i) => i.kind === "status_poll");
  assert.equal(polls[0].count, 3);
  assert.equal(polls[0].rel, "+0.100 s");
  assert.equal(polls[0].lastRel, "+0.300 s");
  assert.equal(polls[0].params.entries, "0: healthy · 2: healthy");
  assert.equal(polls[1].count, 1);
  assert.equal(polls[1].params.entries, "0: unhealthy · 2: unhealthy"); // sorted by rank, whatever the key order
});

test("apply shows its body and HTTP status; anything but 202 is marked bad", () => {
  const applies = shapeTimeline(record).filter((i) => i.kind === "apply");
  assert.deepEqual(applies[0].body, { instruction: "scale_down", params: { removed_dp_ranks: [1] } });
  assert.deepEqual(applies[0].params, { pod: "pod-a", status: "202" });
  assert.deepEqual(
    applies.map((a) => a.tone),
    ["ok", "bad", "bad"],
  );
});

test("probes carry latency; a restarted engine is bad even when the probe answered", () => {
  const probes = shapeTimeline(record).filter((i) => i.kind === "probe");
  assert.equal(probes[0].params.latency, "0.012");
  assert.equal(probes[0].tone, "ok");
  assert.equal(probes[1].tone, "bad");
});

test("a refused gate, a failure and a fallback are bad and carry their words", () => {
  const items = shapeTimeline({
    events: [
      { t_sec: 0, kind: "gate", allowed: false, reason_codes: ["EPLB_REQUIRED", "NO_SURVIVOR"] },
      { t_sec: 0.1, kind: "failed", error: "gate refused: EPLB_REQUIRED" },
      { t_sec: 0.2, kind: "fallback", strategy: "InstanceReconfiguration", reason: "gate" },
      { t_sec: 0.3, kind: "outcome", outcome: "failed" },
    ],
  });
  assert.deepEqual(items[0].params, { reasons: "EPLB_REQUIRED, NO_SURVIVOR" });
  assert.ok(items.every((i) => i.tone === "bad"));
});

test("a missing time stays unknown (null), and junk events are skipped", () => {
  const items = shapeTimeline({ events: [null, 3, { kind: "decided" }] });
  assert.equal(items.length, 1);
  assert.equal(items[0].rel, null);
  assert.equal(items[0].params.candidates, "—");
  assert.deepEqual(shapeTimeline(null), []);
  assert.equal(relTime(12.3456), "+12.346 s");
});

test("every timeline key used exists in both languages with the same placeholders", () => {
  const kinds = [
    ...record.events,
    { kind: "decided", hardware_matched: true },
    { kind: "gate", allowed: false },
    { kind: "guard", renewed: true },
    ...["guard_failed", "guard_renewal_failed", "probe_failed", "nudge_failed", "absorbed", "nudge"].map((kind) => ({ kind })),
    { kind: "coordinator_set" },
    { kind: "probe", ok: false },
    { kind: "finalize", commit: true, repeated: true },
    { kind: "finalize_failed" },
    { kind: "pod_stop", ok: true },
    { kind: "pod_stop", ok: false },
    { kind: "failed" },
    ...["failed", "succeeded", "deduplicated", "odd"].map((outcome) => ({ kind: "outcome", outcome })),
    ...["evidence", "hardware_fault", "fallback", "fallback_failed", "engines_restart", "engines_ready", "write_ahead"].map(
      (kind) => ({ kind }),
    ),
  ];
  const names = (text) => [...text.matchAll(/\{(\w+)\}/g)].map((m) => m[1]);
  for (const item of shapeTimeline({ events: kinds })) {
    for (const lang of ["en", "zh"]) {
      const text = LANGUAGES[lang][item.key];
      assert.ok(text, `${lang} ${item.key}`);
      for (const name of names(text)) assert.ok(name in item.params, `${item.key} needs {${name}}`);
    }
  }
});

// ---- evidence download ------------------------------------------------------------------------------------------
test("the evidence document holds the round verbatim, the instance status and a safe file name", () => {
  const doc = evidenceDocument({ ...record, request_id: "sd-1/../x" }, entry(), "2026-01-01T00:00:00Z");
  assert.equal(doc.filename, "heteroflow-round-sd-1_.._x.json");
  const parsed = JSON.parse(doc.text);
  assert.deepEqual(parsed.round.events, record.events);
  assert.equal(parsed.instance_status.instance_id, "inst-1");
  assert.equal(parsed.exported_at, "2026-01-01T00:00:00Z");
});

test("each rank's place: its pod's node, and its card when it registered exactly one with an index", () => {
  const places = rankPlaces(
    entry({
      pods: [
        {
          pod_id: "a",
          node_name: "node-1",
          ranks: [
            { rank: 0, devices: [{ device_id: "GPU-a", index: 2 }] },
            { rank: 1, devices: [{ device_id: "GPU-b", index: 3 }, { device_id: "GPU-c", index: 4 }] },
          ],
        },
        { pod_id: "b", node_name: "", ranks: [{ rank: 2, devices: [{ device_id: "npu-0", index: null }] }] },
        { pod_id: "c", state: "unknown" }, // a pod the controller knows nothing more of
        { pod_id: "d", node_name: "node-4", ranks: [{ rank: "3" }, null] },
        // a relaunch without rank 4 started 5 as engine rank 4 of 5; rank 6 reports itself (not renumbered)
        {
          pod_id: "e",
          node_name: "node-5",
          ranks: [
            { rank: 5, devices: [], engine_rank: 4, engine_dp_size: 5 },
            { rank: 6, devices: [], engine_rank: 6, engine_dp_size: 7 },
          ],
        },
        // elastic EP resized the worlds of ranks 7 (asked for 3 ranks) and 8 (size not said); 9 says nonsense
        {
          pod_id: "f",
          node_name: "node-6",
          ranks: [
            { rank: 7, devices: [], engine_rank: 7, engine_dp_size: 8, elastic_ep_resized: true, elastic_ep_requested_dp_size: 3 },
            { rank: 8, devices: [], elastic_ep_resized: true, elastic_ep_requested_dp_size: null },
            { rank: 9, devices: [], elastic_ep_resized: "yes", elastic_ep_requested_dp_size: 2 },
          ],
        },
      ],
    }),
  );
  const plain = { engineRank: null, engineDpSize: null, elasticResized: false, elasticRequestedDpSize: null };
  assert.deepEqual([...places.keys()], [0, 1, 2, 5, 6, 7, 8, 9]);
  const elastic = { pod: "f", node: "node-6", gpuIndex: null, engineRank: null, engineDpSize: null, elasticResized: true };
  assert.deepEqual(places.get(7), { ...elastic, elasticRequestedDpSize: 3 });
  assert.deepEqual(places.get(8), { ...elastic, elasticRequestedDpSize: null });
  assert.deepEqual(places.get(9), { pod: "f", node: "node-6", gpuIndex: null, ...plain });
  assert.deepEqual(places.get(0), { pod: "a", node: "node-1", gpuIndex: 2, ...plain });
  assert.deepEqual(places.get(1), { pod: "a", node: "node-1", gpuIndex: null, ...plain }); // two cards: no single one
  assert.deepEqual(places.get(2), { pod: "b", node: null, gpuIndex: null, ...plain });
  assert.deepEqual(places.get(5), { pod: "e", node: "node-5", gpuIndex: null, ...plain, engineRank: 4, engineDpSize: 5 });
  assert.deepEqual(places.get(6), { pod: "e", node: "node-5", gpuIndex: null, ...plain });
  assert.equal(rankPlaces({}).size, 0);
  assert.equal(nodeLink("node-1", 2), "/nodes/gpu-health?node=node-1&gpu=2");
  assert.equal(nodeLink("node-1", null), "/nodes/gpu-health?node=node-1");
});

test("a rank's card link carries the card's own source, like the alerts page's card links", () => {
  const nodes = nodeDirectory([
    { id: "n-sim", name: "sim-local-01", source: "simulated" },
    { id: "n-real", name: "node-1", source: "real" },
    { id: "n-a", name: "twice", source: "real" },
    { id: "n-b", name: "twice", source: "simulated" },
    { id: 7, name: "bad" },
    null,
  ]);
  assert.deepEqual([...nodes.keys()].sort(), ["node-1", "sim-local-01"]); // a name on two nodes is ambiguous
  // a simulated node: the card itself, on the simulated source
  assert.equal(
    nodeLink("sim-local-01", 1, nodes.get("sim-local-01")),
    "/nodes/gpu-health?source=simulated&card=n-sim%3A1",
  );
  assert.equal(nodeLink("sim-local-01", null, nodes.get("sim-local-01")), "/nodes/gpu-health?source=simulated&node=sim-local-01");
  // a real node: no source parameter (real is the page's default)
  assert.equal(nodeLink("node-1", 0, nodes.get("node-1")), "/nodes/gpu-health?card=n-real%3A0");
  // a node the list does not hold (or holds twice): the node's name, the page resolves it and its source
  assert.equal(nodeLink("twice", 2, nodes.get("twice")), "/nodes/gpu-health?node=twice&gpu=2");
  assert.equal(nodeDirectory(undefined).size, 0);
  // the link the GPU health page reads back
  const p = new URLSearchParams(nodeLink("sim-local-01", 3, nodes.get("sim-local-01")).split("?")[1]);
  assert.equal(p.get("source"), "simulated");
  assert.equal(p.get("card"), "n-sim:3");
});

test("a relaunch not in place names its kind, its reason's dictionary key and what it concerns", () => {
  assert.equal(relaunchInfo(entry({ relaunch: null })), null);
  assert.equal(relaunchInfo(entry()), null);
  const refused = relaunchInfo(
    entry({
      phase: "RECONFIGURING",
      relaunch: {
        kind: "REFUSED",
        reason_code: "standing_fault_scale_down_refused",
        reason: "ranks 3 run on cards with a standing hardware fault and the instance cannot run without them",
        ranks: [3, "x"],
        faults: ["XID79|GPU-3|node-b"],
        pods: [],
        gate_reasons: ["FEATURE_DISABLED"],
      },
    }),
  );
  assert.deepEqual(refused, {
    kind: "REFUSED",
    kindKey: "serving.relaunch.kind.REFUSED",
    refused: true,
    reason: "ranks 3 run on cards with a standing hardware fault and the instance cannot run without them",
    reasonKey: "serving.relaunch.reason.standing_fault_scale_down_refused",
    ranks: [3],
    faults: ["XID79|GPU-3|node-b"],
    pods: [],
    gateReasons: ["FEATURE_DISABLED"],
  });
  // a code of a newer controller: its English sentence, no dictionary key
  const newer = relaunchInfo(entry({ relaunch: { kind: "ELSEWHERE", reason_code: "moved", reason: "moved away" } }));
  assert.equal(newer.kindKey, null);
  assert.equal(newer.reasonKey, null);
  assert.equal(newer.refused, false);
  assert.equal(newer.reason, "moved away");
});

test("every relaunch kind and reason code has a text in both languages", async () => {
  const { LANGUAGES } = await import("../../../src/heteroflow/platform_server/web/ui/i18n.js");
  const { RELAUNCH_KINDS, RELAUNCH_REASONS } = await import(
    "../../../src/heteroflow/platform_server/web/ui/logic/serving.js"
  );
  for (const language of Object.values(LANGUAGES)) {
    for (const kind of RELAUNCH_KINDS) assert.ok(language[`serving.relaunch.kind.${kind}`], kind);
    for (const code of RELAUNCH_REASONS) assert.ok(language[`serving.relaunch.reason.${code}`], code);
  }
});

// ---- the round's story, hardware faults as one truth -------------------------------------------------------------
test("a rank whose card has a standing or pending hardware fault is never alive", () => {
  const pods = [
    { pod_id: "pod-a", node_name: "n1", ranks: [{ rank: 0, devices: [{ device_id: "GPU-0", index: 0 }] }, { rank: 1, devices: [{ device_id: "GPU-1", index: 1 }] }] },
  ];
  const standing = entry({ pods, standing_hardware_faults: ["XID_79|1|n1"] });
  assert.deepEqual(states(standing), ["alive", "hw_fault", "alive", "alive"]);
  assert.deepEqual(rankCells(standing)[1].faults, ["XID_79|1|n1"]);
  const pending = entry({ hardware_faults: [{ key: "L6|GPU-2|n2", mapping: "MAPPED", ranks: [2], pending: true }] });
  assert.equal(states(pending)[2], "hw_fault");
  const handled = entry({ hardware_faults: [{ key: "L6|GPU-2|n2", mapping: "MAPPED", ranks: [2], pending: false }] });
  assert.equal(states(handled)[2], "alive");
  // committed dead stays the strongest
  assert.equal(states(entry({ ...standing, dead_committed: [1], alive_dp_ranks: [0, 2, 3] }))[1], "committed_dead");
});

test("the round's story: trigger, clients and absolute times; unknown stays unknown", () => {
  const record = {
    trigger: {
      reason: "COMPLETE_SNAPSHOT",
      ranks: [{ rank: 1, health: "dead", engine: "dead", evidence: "ENGINE_DEAD", first_seen_at: "2026-01-01T00:00:00+00:00" }, { rank: 0, health: "healthy", engine: null, evidence: null }],
      hardware: [{ key: "XID_79|1|n1", level: 6, mapping: "MAPPED", ranks: [1], standing: true }],
    },
    clients: { held: 3, rerouted: 1, resumed: 0, failed: 0, longest_wait_sec: 7.5, complete: true, as_of: "2026-01-01T00:00:09+00:00" },
    times: { fault_at: "2026-01-01T00:00:00+00:00", decided_at: "2026-01-01T00:00:01+00:00", committed_at: null },
  };
  const story = roundStory(record);
  assert.equal(story.trigger.reasonKey, "serving.decision.reason.COMPLETE_SNAPSHOT");
  assert.deepEqual(story.trigger.hardware[0].ranks, [1]);
  assert.equal(story.clients.held, 3);
  assert.equal(story.clients.longestWaitSec, 7.5);
  assert.deepEqual(story.times.map((x) => x.at), ["2026-01-01T00:00:00+00:00", "2026-01-01T00:00:01+00:00", null, null]);
  assert.equal(rankCause(record, 1).evidence, "ENGINE_DEAD");
  assert.equal(rankCause(record, 0), null);
  const bare = roundStory({});
  assert.equal(bare.trigger, null);
  assert.equal(bare.clients, null);
  assert.equal(roundStory({ clients: { error: "refused", as_of: null } }).clientsError, "refused");
  assert.equal(roundStory({ clients: { held: "x", longest_wait_sec: null } }).clients.held, null);
});

test("a last error is resolved only when the newest round succeeded and the instance serves", () => {
  const served = entry({ last_error: "CORRELATION_EXPIRED", can_serve: true, serving_published: true });
  assert.equal(resolvedBy(served, [{ request_id: "sd-1", outcome: "failed" }, { request_id: "fb-1", outcome: "succeeded" }]), "fb-1");
  assert.equal(resolvedBy(served, [{ request_id: "fb-1", outcome: "failed" }]), null);
  assert.equal(resolvedBy({ ...served, can_serve: false }, [{ request_id: "fb-1", outcome: "succeeded" }]), null);
  assert.equal(resolvedBy({ ...served, last_error: null }, [{ request_id: "fb-1", outcome: "succeeded" }]), null);
});

test("the platform server's 503 sentences become dictionary texts in both languages", () => {
  const cases = [
    ["no controller configured: set HETEROFLOW_SERVER_CONTROLLER_URL", "serving.ctl503.unconfigured"],
    ["the controller at http://c:1 did not answer within 5 s", "serving.ctl503.timeout"],
    ["the controller at http://c:1 is unreachable (ConnectError: refused)", "serving.ctl503.unreachable"],
    ["the controller refused this server's cluster token (HTTP 401): check", "serving.ctl503.token"],
    ["the controller answered HTTP 503: not_leader", "serving.ctl503.status_detail"],
    ["the controller answered HTTP 500", "serving.ctl503.status"],
    ["the controller's answer is not JSON", "serving.ctl503.not_json"],
  ];
  for (const [detail, key] of cases) {
    const found = controllerReason(detail);
    assert.equal(found.key, key, detail);
    assert.ok(LANGUAGES.en[key] && LANGUAGES.zh[key], key);
  }
  assert.equal(controllerReason("the controller at http://c:1 is unreachable (ConnectError: refused)").params.error, "ConnectError: refused");
  assert.equal(controllerReason("something else"), null);
});

test("a fallback started by an expired correlation is red only while its path has not succeeded", () => {
  const events = [{ kind: "fallback", strategy: "InstanceReconfiguration", reason: "CORRELATION_EXPIRED", t_sec: 0 }];
  assert.equal(shapeTimelineOf({ events, outcome: null })[0].tone, "bad");
  assert.equal(shapeTimelineOf({ events, outcome: "failed" })[0].tone, "bad");
  assert.equal(shapeTimelineOf({ events, outcome: "succeeded" })[0].tone, "warn");
});

test("a restore to the configured size reads its state, ranks and outcome; unknown states keep no key", async () => {
  const { restoreInfo, restorable } = await import("../../../src/heteroflow/platform_server/web/ui/logic/serving.js");
  assert.equal(restoreInfo({}), null);
  assert.equal(restoreInfo({ restore: null }), null);
  const failed = restoreInfo({
    restore: {
      state: "failed",
      request_id: "rs-1",
      requested_by: "auto_restore",
      ranks: [2, "x"],
      seconds: 21.5,
      error: "TimeoutError: engines [2] not ready within 30 s",
      degraded_phase: "SCALED_DOWN_RUNNING",
    },
  });
  assert.deepEqual(failed, {
    state: "failed",
    stateKey: "serving.restore.state.failed",
    ranks: [2],
    requestedBy: "auto_restore",
    seconds: 21.5,
    error: "TimeoutError: engines [2] not ready within 30 s",
    degradedPhase: "SCALED_DOWN_RUNNING",
    requestId: "rs-1",
  });
  const odd = restoreInfo({ restore: { state: "exploded", seconds: "soon" } });
  assert.equal(odd.stateKey, null);
  assert.equal(odd.seconds, null); // unknown is never 0
  assert.equal(restorable({}), null);
  assert.equal(restorable({ restorable: null }), null);
  assert.deepEqual(restorable({ restorable: "ready" }), { ready: true, reason: "" });
  assert.deepEqual(restorable({ restorable: "pod p is not registered" }), { ready: false, reason: "pod p is not registered" });
});

test("every restore state the controller names has an English and a Chinese text", async () => {
  const { RESTORE_STATES } = await import("../../../src/heteroflow/platform_server/web/ui/logic/serving.js");
  const { LANGUAGES } = await import("../../../src/heteroflow/platform_server/web/ui/i18n.js");
  for (const state of RESTORE_STATES) {
    for (const table of Object.values(LANGUAGES)) {
      assert.ok(table[`serving.restore.state.${state}`], state);
      assert.ok(table[`serving.restore.explain.${state}`], state);
    }
  }
});
