// /serving: every serving instance the controller knows, through the platform server's proxy
// (/api/v1/serving/…; the browser never holds the cluster token). Per instance: its DP ranks coloured by state,
// the phase in plain words, can_serve and the published view, the engines' capability and the gate
// (serving_gate.js), the last error, the pods, the running (or last) round's evidence timeline and the past
// rounds, each downloadable as JSON evidence.
//
// Unlike the other pages this one refreshes by itself: every 2 s while the tab is visible (a round lasts seconds),
// one request chain at a time, paused while the tab is hidden.
import { ApiError, api } from "../api.js";
import { h, replace } from "../dom.js";
import { LANGUAGES, t } from "../i18n.js";
import {
  RANK_STATES,
  controllerReason,
  decisionInfo,
  evidenceDocument,
  fallbackKey,
  hardwareFaults,
  interventionReason,
  nodeDirectory,
  nodeLink,
  pastRounds,
  phaseInfo,
  rankCause,
  rankCells,
  rankPlaces,
  relaunchInfo,
  resolvedBy,
  restorable,
  restoreInfo,
  roundDuration,
  roundStory,
  roundToShow,
  shapeTimeline,
  stateCounts,
} from "../logic/serving.js";
import { allNodes, table } from "./common.js";
import { renderGate } from "./serving_gate.js";

export const REFRESH_MS = 2000;
const NODES_MS = 60_000;

/** A dictionary text when the key exists, else the raw value (a stage or kind this page does not know). */
function known(key, raw) {
  return key in LANGUAGES.en ? t(key) : raw;
}

function fmtSeconds(iso) {
  if (!iso) return t("none");
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return t("unknown");
  return `${d.toISOString().slice(0, 19).replace("T", " ")} ${t("time.utc")}`;
}

/** An absolute time to the millisecond (a round's moments are seconds apart). */
function fmtInstant(iso) {
  if (!iso) return t("serving.story.time.none");
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return t("unknown");
  return `${d.toISOString().slice(0, 23).replace("T", " ")} ${t("time.utc")}`;
}

function fmtClock(date) {
  return `${date.toISOString().slice(11, 19)} ${t("time.utc")}`;
}

function ranksText(list) {
  return Array.isArray(list) ? (list.length ? list.join(", ") : t("none")) : t("unknown");
}

function errorMessage(error) {
  const status = error instanceof ApiError ? error.status : 0;
  const detail = error && error.detail ? error.detail : String(error);
  if (status === 403) return t("serving.error.forbidden");
  if (status === 503) {
    const known503 = controllerReason(detail);
    return t("serving.error.unavailable", { detail: known503 ? t(known503.key, known503.params) : detail });
  }
  if (status === 0) return t("serving.error.network", { detail });
  return t("serving.error.other", { detail });
}

/** ``?instance=<id>``: the instance a link points at (null: none). */
export function linkedInstance(search) {
  const id = (new URLSearchParams(search).get("instance") ?? "").trim();
  return id && id.length <= 253 ? id : null;
}

export function createServingPage(main) {
  const state = {
    linked: linkedInstance(location.search), // highlighted, and scrolled to once it is first shown
    scrolledToLinked: false,
    status: null, // the last good status list
    updatedAt: null,
    error: null, // the last refresh's error (the last good data stays on screen, marked stale)
    rounds: new Map(), // instance id -> {data, error}
    timelines: new Map(), // request id -> {data, error}
    finished: new Map(), // request id -> record of a finished round (it no longer changes: fetched once)
    picked: new Map(), // instance id -> request id the user chose
    downloadError: null, // {instance, error}
    timer: null,
    inFlight: false,
    again: false,
    stopped: false,
    forbidden: false,
    nodes: new Map(), // node name -> {id, source} (the node list; empty until read: links then name the node)
    nodesReadAt: 0, // when the node list was last asked for (ms; it is read again after NODES_MS)
  };
  const headBox = h("section", { class: "block", "aria-labelledby": "serving-title" });
  const listBox = h("div", { id: "serving-instances" });

  async function loadInstance(entry) {
    const id = entry.instance_id;
    try {
      const rounds = await api("/api/v1/serving/rounds", { params: { instance_id: id } });
      state.rounds.set(id, { data: Array.isArray(rounds) ? rounds : [], error: null });
    } catch (error) {
      state.rounds.set(id, { data: state.rounds.get(id)?.data ?? null, error });
    }
    const summaries = state.rounds.get(id).data ?? [];
    // a finished round's duration comes from its record when the controller measured no round_total (failed
    // rounds, fallbacks, fast recoveries): fetch each such record once; it no longer changes
    const missing = summaries.filter(
      (r) => r.outcome != null && roundDuration(r) === null && !state.finished.has(String(r.request_id)),
    );
    await Promise.all(
      missing.map(async (r) => {
        try {
          state.finished.set(String(r.request_id), await api(`/api/v1/serving/rounds/${encodeURIComponent(r.request_id)}`));
        } catch {
          // the duration stays unknown; the next refresh tries again
        }
      }),
    );
    const show = roundToShow(entry, summaries, state.picked.get(id) ?? null);
    if (!show) return;
    try {
      const record = await api(`/api/v1/serving/rounds/${encodeURIComponent(show.requestId)}`);
      state.timelines.set(show.requestId, { data: record, error: null });
      if (record && record.outcome != null) state.finished.set(show.requestId, record);
    } catch (error) {
      state.timelines.set(show.requestId, { data: state.timelines.get(show.requestId)?.data ?? null, error });
    }
  }

  async function tick() {
    clearTimeout(state.timer);
    state.timer = null;
    if (state.stopped) return;
    if (state.inFlight) {
      state.again = true; // a click wants fresh data: run once more as soon as this refresh ends
      return;
    }
    state.inFlight = true;
    try {
      const entries = await api("/api/v1/serving/status");
      if (state.stopped) return;
      await readNodes();
      const list = Array.isArray(entries) ? entries : [];
      await Promise.all(list.map(loadInstance));
      state.status = list;
      state.updatedAt = new Date();
      state.error = null;
    } catch (error) {
      state.error = error;
      state.forbidden = error instanceof ApiError && error.status === 403;
    } finally {
      state.inFlight = false;
    }
    if (state.stopped) return;
    render();
    if (state.again) {
      state.again = false;
      tick();
    } else {
      schedule();
    }
  }

  // The node list, so a rank's link names its card on the node's own source; it changes seldom, so it is read
  // once a minute, and a failure only leaves the links naming the node (the GPU health page resolves it).
  async function readNodes() {
    const now = Date.now();
    if (now - state.nodesReadAt < NODES_MS) return;
    state.nodesReadAt = now;
    try {
      state.nodes = nodeDirectory(await allNodes());
    } catch {
      // the links keep naming the node
    }
  }

  function schedule() {
    clearTimeout(state.timer);
    state.timer = null;
    // 403 will not change by itself; everything else (a controller restarting, a network blip) may.
    if (state.stopped || state.forbidden || document.hidden) return;
    state.timer = setTimeout(tick, REFRESH_MS);
  }

  function onVisibility() {
    if (document.hidden) {
      clearTimeout(state.timer);
      state.timer = null;
      renderHead();
    } else if (!state.timer && !state.forbidden) {
      tick();
    }
  }

  async function download(entry, requestId) {
    try {
      const record = await api(`/api/v1/serving/rounds/${encodeURIComponent(requestId)}`);
      const { filename, text } = evidenceDocument(record, entry, new Date().toISOString());
      const url = URL.createObjectURL(new Blob([text], { type: "application/json" }));
      const link = h("a", { href: url, download: filename, hidden: true });
      document.body.append(link);
      link.click();
      link.remove();
      setTimeout(() => URL.revokeObjectURL(url), 60_000);
      state.downloadError = null;
    } catch (error) {
      state.downloadError = { instance: entry.instance_id, error };
    }
    render();
  }

  function pick(instanceId, requestId) {
    if (requestId) state.picked.set(instanceId, requestId);
    else state.picked.delete(instanceId);
    render();
    tick();
  }

  // ---- rendering -------------------------------------------------------------------------------------------
  function renderHead() {
    const line = [t("serving.refresh")];
    if (state.updatedAt) line.push(t("serving.updated", { time: fmtClock(state.updatedAt) }));
    if (document.hidden && !state.forbidden) line.push(t("serving.paused"));
    let error = null;
    if (state.error) {
      error = h(
        "div",
        { class: "error-box", role: "alert", id: "serving-error", dataset: { status: String(state.error.status ?? 0) } },
        h("p", { class: "error" }, errorMessage(state.error)),
        state.updatedAt && !state.forbidden
          ? h("p", { class: "muted small" }, t("serving.stale", { time: fmtClock(state.updatedAt) }))
          : null,
      );
    }
    replace(
      headBox,
      h("h1", { id: "serving-title" }, t("serving.title")),
      h("p", { class: "muted small", id: "serving-refresh" }, line.join(" · ")),
      error,
    );
  }

  /** The record of the round the timeline shows (null until loaded). */
  function shownRecord(entry) {
    const rounds = state.rounds.get(entry.instance_id)?.data ?? [];
    const show = roundToShow(entry, rounds, state.picked.get(entry.instance_id) ?? null);
    return show ? { show, record: state.timelines.get(show.requestId)?.data ?? null } : { show: null, record: null };
  }

  /** The newest loaded round record whose trigger names ``rank`` as faulted: the cause a retired rank keeps. */
  function causeOf(entry, rank) {
    const rounds = [...(state.rounds.get(entry.instance_id)?.data ?? [])].reverse();
    for (const r of rounds) {
      const id = String(r.request_id);
      const record = state.timelines.get(id)?.data ?? state.finished.get(id) ?? null;
      const row = record ? rankCause(record, rank) : null;
      if (row) return { row, id };
    }
    return null;
  }

  function engineText(entry, cell) {
    if (cell.engine) return t("serving.engine", { status: cell.engine });
    if (cell.state === "committed_dead" || cell.state === "withdrawn" || cell.state === "dead") {
      const cause = causeOf(entry, cell.rank);
      if (cause) {
        return t("serving.rank.cause", {
          health: cause.row.health,
          evidence: cause.row.evidence ?? t("unknown"),
          id: cause.id,
        });
      }
    }
    return t("serving.engine_unknown");
  }

  function renderRanks(entry) {
    const cells = rankCells(entry);
    const places = rankPlaces(entry);
    const placeLink = (rank) => {
      const place = places.get(rank);
      if (!place?.node) return null;
      const card = place.gpuIndex === null ? place.node : `${place.node} #${place.gpuIndex}`;
      return h(
        "a",
        { class: "rank-node", href: nodeLink(place.node, place.gpuIndex, state.nodes.get(place.node)), title: t("serving.rank_node_link", { rank, card }) },
        card,
      );
    };
    const counts = stateCounts(cells);
    const summary = RANK_STATES.filter((s) => counts[s] > 0)
      .map((s) => t("serving.count", { count: counts[s], state: t(`serving.state.${s}`) }))
      .join(" · ");
    return [
      h("h3", {}, t("serving.ranks")),
      h(
        "ul",
        { class: "rank-grid", "aria-label": t("serving.ranks_label", { id: entry.instance_id }) },
        cells.map((cell) =>
          h(
            "li",
            {
              class: `rank state-${cell.state}`,
              dataset: { rank: String(cell.rank), state: cell.state },
              title: t(`serving.state.${cell.state}.explain`),
            },
            h("span", { class: "rank-id" }, t("serving.rank", { rank: cell.rank })),
            h("span", { class: "rank-state" }, t(`serving.state.${cell.state}`)),
            h("span", { class: "rank-engine" }, engineText(entry, cell)),
            cell.faults.length
              ? h("span", { class: "rank-hw" }, t("serving.rank.hw", { faults: cell.faults.join(", ") }))
              : null,
            cell.published === null
              ? null
              : h(
                  "span",
                  { class: cell.published ? "rank-pub" : "rank-pub off" },
                  cell.published ? t("serving.rank_published") : t("serving.rank_unpublished"),
                ),
            placeLink(cell.rank),
            places.get(cell.rank)?.engineRank == null
              ? null
              : h(
                  "span",
                  { class: "rank-renumbered small", title: t("serving.rank.renumbered.explain") },
                  t("serving.rank.renumbered", {
                    engine: places.get(cell.rank).engineRank,
                    size: places.get(cell.rank).engineDpSize,
                  }),
                ),
            places.get(cell.rank)?.elasticResized
              ? h(
                  "span",
                  { class: "rank-elastic small", title: t("serving.rank.elastic_resized.explain") },
                  places.get(cell.rank).elasticRequestedDpSize == null
                    ? t("serving.rank.elastic_resized")
                    : t("serving.rank.elastic_resized.size", { size: places.get(cell.rank).elasticRequestedDpSize }),
                )
              : null,
          ),
        ),
      ),
      h("p", { class: "small rank-summary" }, summary),
      h(
        "ul",
        { class: "legend small", "aria-label": t("serving.legend") },
        RANK_STATES.map((s) =>
          h(
            "li",
            {},
            h("span", { class: `swatch state-${s}`, "aria-hidden": "true" }),
            h("strong", {}, t(`serving.state.${s}`)),
            " — ",
            t(`serving.state.${s}.explain`),
          ),
        ),
      ),
    ];
  }

  function renderFacts(entry) {
    // each label and its value stay together in one grid cell, whatever the number of columns
    const fact = (key, value, extra = {}) => h("div", { class: "fact", ...extra }, h("dt", {}, t(key)), h("dd", {}, value));
    const decision = decisionInfo(entry.last_decision);
    const fallback = entry.fallback_strategy ?? null;
    const fallbackWhy = fallback ? fallbackKey(fallback) : null;
    const shown = shownRecord(entry);
    const story = shown.record ? roundStory(shown.record) : null;
    return h(
      "dl",
      { class: "facts instance-facts" },
      fact("serving.facts.original", ranksText(entry.original_dp_ranks)),
      fact("serving.facts.alive", ranksText(entry.alive_dp_ranks)),
      fact("serving.facts.committed", ranksText(entry.dead_committed)),
      fact("serving.facts.pending", ranksText(entry.pending_removed_ranks)),
      fact("serving.facts.published", ranksText(entry.published_endpoints)),
      fact(
        "serving.facts.fallback",
        fallback ? [h("code", {}, fallback), fallbackWhy ? h("span", { class: "explain" }, t(fallbackWhy)) : null] : t("none"),
      ),
      fact("serving.facts.generation", entry.generation ?? t("unknown")),
      fact(
        "serving.facts.request_id",
        shown.show ? h("code", {}, shown.show.requestId) : entry.request_id ? h("code", {}, entry.request_id) : t("none"),
        { class: "fact", dataset: { round: shown.show?.requestId ?? "" } },
      ),
      fact("serving.facts.running", entry.running_strategy ?? t("none")),
      fact(
        "serving.facts.decision",
        decision === null
          ? t("serving.decision.none")
          : [
              decision.kindKey ? t(decision.kindKey) : h("code", {}, decision.kind),
              decision.reason ? [" ", h("code", { class: "reason-code" }, decision.reason)] : null,
              decision.reasonKey ? h("span", { class: "explain" }, t(decision.reasonKey)) : null,
            ],
        { class: "fact wide", dataset: { decision: decision?.raw ?? "" } },
      ),
      shown.record
        ? fact(
            "serving.facts.trigger",
            story.trigger?.reason
              ? [
                  h("code", { class: "reason-code" }, story.trigger.reason),
                  story.trigger.reasonKey ? h("span", { class: "explain" }, t(story.trigger.reasonKey)) : null,
                ]
              : t("serving.facts.trigger_none"),
            { class: "fact wide trigger-fact", dataset: { reason: story.trigger?.reason ?? "" } },
          )
        : null,
    );
  }

  function renderHardware(entry) {
    const faults = hardwareFaults(entry);
    const title = h("h3", {}, t("serving.hw"));
    const standing = Array.isArray(entry.standing_hardware_faults) ? entry.standing_hardware_faults.map(String) : [];
    const standingLine = standing.length
      ? h("p", { class: "warning hw-standing" }, t("serving.hw.standing", { faults: standing.join(", ") }))
      : null;
    if (faults.length === 0) {
      // one truth: a standing fault named elsewhere on the page is never "no hardware fault seen"
      return [title, standingLine ?? h("p", { class: "empty hw-empty" }, t("serving.hw.empty"))];
    }
    return [
      title,
      standingLine,
      table(
        t("serving.hw"),
        [
          t("serving.hw.col.key"),
          t("serving.hw.col.level"),
          t("serving.hw.col.source"),
          t("serving.hw.col.mapping"),
          t("serving.hw.col.ranks"),
          t("serving.hw.col.state"),
        ],
        faults.map((f) =>
          h(
            "tr",
            { dataset: { key: f.key, mapping: f.mapping } },
            h("td", {}, h("code", {}, f.key)),
            h("td", {}, f.level ?? t("unknown")),
            h("td", {}, f.source ?? t("unknown")),
            h(
              "td",
              {},
              h("code", {}, f.mapping || t("unknown")),
              f.mappingKey ? h("span", { class: "explain" }, t(f.mappingKey)) : null,
              f.reasonKey
                ? h("span", { class: "explain muted" }, t(f.reasonKey, { subject: f.reasonSubject }))
                : f.reason
                  ? h("span", { class: "explain muted" }, f.reason)
                  : null,
            ),
            h("td", {}, f.ranks.length ? f.ranks.join(", ") : t("none")),
            h(
              "td",
              {},
              f.pending === null ? t("unknown") : f.pending ? t("serving.hw.pending") : t("serving.hw.handled"),
            ),
          ),
        ),
        { class: "hardware" },
      ),
    ];
  }

  function renderRelaunch(entry) {
    const plan = relaunchInfo(entry);
    if (plan === null) return null;
    const words = {
      ranks: plan.ranks.join(", "),
      pods: plan.pods.join(", "),
      gate: plan.gateReasons.join(", "),
    };
    return h(
      "p",
      plan.refused
        ? { class: "intervention error relaunch", role: "alert", dataset: { kind: plan.kind } }
        : { class: "warning relaunch", dataset: { kind: plan.kind } },
      h("strong", {}, plan.kindKey ? t(plan.kindKey) : plan.kind),
      " ",
      plan.reasonKey ? t(plan.reasonKey, words) : plan.reason,
      plan.faults.length ? " " : null,
      plan.faults.length ? h("code", {}, plan.faults.join(", ")) : null,
    );
  }

  function renderRestore(entry) {
    const last = restoreInfo(entry);
    const can = restorable(entry);
    if (last === null && can === null) return null;
    const parts = [];
    if (last !== null) {
      const words = {
        ranks: last.ranks.join(", "),
        seconds: last.seconds === null ? t("unknown") : last.seconds.toFixed(1),
        by: last.requestedBy === "auto_restore" ? t("serving.restore.by.auto") : t("serving.restore.by.operator"),
      };
      parts.push(
        h("strong", {}, last.stateKey ? t(last.stateKey) : last.state),
        " ",
        t(`serving.restore.explain.${last.stateKey ? last.state : "running"}`, words),
      );
      if (last.error) parts.push(" ", h("code", {}, last.error));
    }
    if (can !== null && (last === null || last.state !== "running")) {
      if (parts.length) parts.push(" ");
      parts.push(
        can.ready
          ? h("span", { class: "restorable" }, t("serving.restore.ready"))
          : h("span", { class: "muted restorable" }, t("serving.restore.not_ready"), " ", h("code", {}, can.reason)),
      );
    }
    const failed = last !== null && last.state === "failed";
    return h(
      "p",
      { class: failed ? "warning restore" : "restore", dataset: { state: last ? last.state : "none" } },
      ...parts,
    );
  }

  function renderErrors(entry) {
    const intervention = interventionReason(entry);
    const resolved = intervention ? null : resolvedBy(entry, state.rounds.get(entry.instance_id)?.data ?? []);
    return [
      renderRelaunch(entry),
      renderRestore(entry),
      intervention
        ? h(
            "p",
            { class: "intervention error", role: "alert" },
            h("strong", {}, t("serving.intervention.title")),
            " ",
            t("serving.intervention.explain"),
            " ",
            h("code", {}, intervention),
          )
        : null,
      h(
        "p",
        { class: "last-error", dataset: { resolved: resolved ? "true" : "false" } },
        h("strong", {}, t("serving.last_error")),
        " ",
        !entry.last_error
          ? h("span", { class: "muted" }, t("serving.no_error"))
          : resolved
            ? [
                h("span", { class: "resolved-error" }, entry.last_error),
                " ",
                h("span", { class: "muted small" }, t("serving.last_error.resolved", { id: resolved })),
              ]
            : h("span", { class: "error" }, entry.last_error),
      ),
      entry.store_error ? h("p", { class: "warning" }, t("serving.store_error", { detail: entry.store_error })) : null,
      entry.persist_pending ? h("p", { class: "warning" }, t("serving.persist_pending")) : null,
    ];
  }

  function renderPods(entry) {
    const pods = Array.isArray(entry.pods) ? entry.pods : [];
    const title = h("h3", {}, t("serving.pods"));
    if (pods.length === 0) return [title, h("p", { class: "empty" }, t("serving.pods.empty"))];
    const stateKey = (s) => (s === "up" || s === "lost" ? s : "unknown");
    const yesNo = (v) => (v === true ? t("serving.yes") : v === false ? t("serving.no") : t("unknown"));
    return [
      title,
      table(
        t("serving.pods"),
        [
          t("serving.pod.col.id"),
          t("serving.pod.col.node"),
          t("serving.pod.col.ip"),
          t("serving.pod.col.state"),
          t("serving.pod.col.silent"),
          t("serving.pod.col.complete"),
          t("serving.pod.col.heartbeats"),
        ],
        pods.map((p) =>
          h(
            "tr",
            { dataset: { pod: String(p.pod_id), state: stateKey(p.state) } },
            h("td", {}, h("code", {}, p.pod_id)),
            h(
              "td",
              { class: "pod-node" },
              typeof p.node_name === "string" && p.node_name
                ? h(
                    "a",
                    { href: nodeLink(p.node_name, null, state.nodes.get(p.node_name)), title: t("serving.pod.node_link", { node: p.node_name }) },
                    p.node_name,
                  )
                : t("unknown"),
            ),
            h("td", {}, typeof p.pod_ip === "string" && p.pod_ip ? h("code", {}, p.pod_ip) : t("unknown")),
            h(
              "td",
              {},
              h(
                "span",
                { class: `badge ${p.state === "up" ? "tone-ok" : p.state === "lost" ? "tone-bad" : "tone-unknown"}` },
                t(`serving.pod.${stateKey(p.state)}`),
              ),
            ),
            h(
              "td",
              { class: "num" },
              typeof p.silent_sec === "number" ? t("serving.pod.silent", { sec: p.silent_sec.toFixed(1) }) : t("unknown"),
            ),
            h("td", {}, yesNo(p.heartbeat_complete)),
            h("td", { class: "num" }, typeof p.heartbeats === "number" ? String(p.heartbeats) : t("unknown")),
          ),
        ),
        { class: "pods" },
      ),
    ];
  }

  function outcomeBadge(outcome, tone) {
    const text = outcome == null ? t("serving.round.running") : known(`serving.outcome.${outcome}`, String(outcome));
    return h("span", { class: `badge tone-${tone}`, dataset: { outcome: outcome ?? "running" } }, text);
  }

  function renderTimeline(entry) {
    const id = entry.instance_id;
    const rounds = state.rounds.get(id)?.data ?? [];
    const show = roundToShow(entry, rounds, state.picked.get(id) ?? null);
    const titleKey = !show
      ? "serving.round.current"
      : show.picked
        ? "serving.round.picked"
        : show.running
          ? "serving.round.current"
          : "serving.round.last";
    const head = h(
      "div",
      { class: "block-head" },
      h("h3", {}, t(titleKey), show ? [" ", h("code", {}, show.requestId)] : null),
      show?.picked
        ? h(
            "button",
            { type: "button", class: "round-back", id: `round-back-${id}`, onclick: () => pick(id, null) },
            t("serving.round.back"),
          )
        : null,
    );
    if (!show) return h("div", { class: "timeline-box" }, head, h("p", { class: "empty" }, t("serving.round.none")));
    const loaded = state.timelines.get(show.requestId);
    const parts = [head];
    if (loaded?.error) {
      const missing = loaded.error instanceof ApiError && loaded.error.status === 404;
      parts.push(
        h(
          "p",
          { class: "error", role: "status" },
          missing ? t("serving.error.round_missing") : t("serving.error.round", { detail: errorMessage(loaded.error) }),
        ),
      );
    }
    const record = loaded?.data;
    if (!record) {
      if (!loaded) parts.push(h("p", { class: "muted", role: "status" }, t("loading")));
      return h("div", { class: "timeline-box", dataset: { request: show.requestId } }, parts);
    }
    const summary = pastRounds([record], new Map([[show.requestId, record]]))[0];
    parts.push(
      h(
        "p",
        { class: "small round-meta" },
        t("serving.round.meta", {
          kind: known(`serving.kind.${record.kind}`, String(record.kind)),
          started: fmtSeconds(record.started_at),
        }),
        " ",
        outcomeBadge(summary.outcome, summary.tone),
      ),
    );
    parts.push(renderStory(record));
    const items = shapeTimeline(record);
    parts.push(
      items.length === 0
        ? h("p", { class: "empty" }, t("serving.round.no_events"))
        : h(
            "ol",
            { class: "timeline", dataset: { request: show.requestId } },
            items.map((item) =>
              h(
                "li",
                { class: `tl-item tone-${item.tone}`, dataset: { kind: item.kind } },
                h("span", { class: "tl-time" }, item.rel ?? t("unknown")),
                h(
                  "div",
                  { class: "tl-body" },
                  h("span", { class: "tl-text" }, t(item.key, item.params)),
                  item.count > 1
                    ? h(
                        "span",
                        { class: "tl-repeat small muted" },
                        ` ${t("serving.round.repeat", { count: item.count, last: item.lastRel ?? t("unknown") })}`,
                      )
                    : null,
                  item.body
                    ? h(
                        "pre",
                        {
                          class: "tl-detail",
                          "aria-label": item.kind === "apply" ? t("serving.round.body") : t("serving.round.detail"),
                        },
                        JSON.stringify(item.body),
                      )
                    : null,
                ),
              ),
            ),
          ),
    );
    if (record.dropped_events > 0) {
      parts.push(h("p", { class: "warning" }, t("serving.round.dropped", { count: record.dropped_events })));
    }
    const stages = Object.entries(record.stage_seconds ?? {});
    if (!stages.some(([name]) => name === "round_total") && summary.totalSec !== null) {
      stages.push(["round_total", summary.totalSec]); // measured from the outcome event: every kind has one
    }
    if (stages.length) {
      parts.push(
        h("h4", {}, t("serving.round.stages")),
        h(
          "dl",
          { class: "facts stages" },
          stages.map(([name, sec]) =>
            h(
              "div",
              { class: "fact", dataset: { stage: name } },
              h("dt", {}, known(`serving.stage.${name}`, name)),
              h("dd", {}, typeof sec === "number" ? t("serving.seconds", { sec: sec.toFixed(3) }) : t("unknown")),
            ),
          ),
        ),
      );
    }
    return h("div", { class: "timeline-box", dataset: { request: show.requestId } }, parts);
  }

  function renderStory(record) {
    const story = roundStory(record);
    const box = [];
    // why it started
    box.push(h("h4", {}, t("serving.story.trigger")));
    if (story.trigger === null) {
      box.push(h("p", { class: "empty" }, t("serving.story.no_trigger")));
    } else {
      const tr = story.trigger;
      box.push(
        h(
          "p",
          { class: "story-reason", dataset: { reason: tr.reason ?? "" } },
          h("strong", {}, t("serving.story.reason")),
          " ",
          tr.reason ? h("code", { class: "reason-code" }, tr.reason) : t("unknown"),
          tr.reasonKey ? h("span", { class: "explain" }, t(tr.reasonKey)) : null,
        ),
      );
      if (tr.ranks.length) {
        box.push(
          table(
            t("serving.story.trigger"),
            [
              t("serving.story.col.rank"),
              t("serving.story.col.health"),
              t("serving.story.col.engine"),
              t("serving.story.col.evidence"),
              t("serving.story.col.first_seen"),
            ],
            tr.ranks.map((row) =>
              h(
                "tr",
                { dataset: { rank: String(row.rank), health: row.health ?? "" } },
                h("td", {}, t("serving.rank", { rank: row.rank })),
                h("td", {}, row.health ? h("code", {}, row.health) : t("unknown")),
                h("td", {}, row.engine ? h("code", {}, row.engine) : t("serving.engine_unknown")),
                h("td", {}, row.evidence ? h("code", {}, row.evidence) : t("none")),
                h("td", { class: "nowrap" }, row.firstSeenAt ? fmtInstant(row.firstSeenAt) : t("none")),
              ),
            ),
            { class: "trigger-ranks" },
          ),
        );
      }
      box.push(
        h("p", { class: "small story-hw-title" }, h("strong", {}, t("serving.story.hw"))),
        tr.hardware.length
          ? h(
              "ul",
              { class: "story-hw small" },
              tr.hardware.map((hw) =>
                h(
                  "li",
                  { dataset: { key: hw.key } },
                  t("serving.story.hw.item", {
                    key: hw.key,
                    level: hw.level ?? "?",
                    mapping: hw.mapping ?? t("unknown"),
                    ranks: hw.ranks.length ? hw.ranks.join(", ") : t("none"),
                  }),
                  hw.standing ? ` ${t("serving.story.hw.standing")}` : null,
                ),
              ),
            )
          : h("p", { class: "empty small" }, t("serving.story.hw.none")),
      );
    }
    // what clients saw
    box.push(h("h4", {}, t("serving.story.clients")));
    if (story.clientsError) {
      box.push(h("p", { class: "warning story-clients-error" }, t("serving.story.clients.error", { error: story.clientsError })));
    } else if (story.clients === null) {
      box.push(h("p", { class: "muted story-clients-pending" }, t("serving.story.clients.pending")));
    } else {
      const c = story.clients;
      const fact = (key, value, name) =>
        h("div", { class: "fact", dataset: { count: name } }, h("dt", {}, t(key)), h("dd", {}, value));
      box.push(
        h(
          "dl",
          { class: "facts story-clients" },
          ["held", "rerouted", "resumed", "failed"].map((k) =>
            fact(`serving.story.clients.${k}`, c[k] === null ? t("unknown") : String(c[k]), k),
          ),
          fact(
            "serving.story.clients.longest_wait",
            c.longestWaitSec === null ? t("serving.story.clients.no_wait") : t("serving.seconds", { sec: c.longestWaitSec.toFixed(3) }),
            "longest_wait_sec",
          ),
        ),
        c.complete ? null : h("p", { class: "warning" }, t("serving.story.clients.incomplete")),
        c.asOf ? h("p", { class: "muted small" }, t("serving.story.clients.as_of", { time: fmtInstant(c.asOf) })) : null,
      );
    }
    // absolute times
    box.push(
      h("h4", {}, t("serving.story.times")),
      h(
        "dl",
        { class: "facts story-times" },
        story.times.map(({ name, at }) =>
          h(
            "div",
            { class: "fact", dataset: { time: name, at: at ?? "" } },
            h("dt", {}, t(`serving.story.time.${name}`)),
            h("dd", {}, fmtInstant(at)),
          ),
        ),
      ),
    );
    return h("div", { class: "round-story" }, box);
  }

  function renderPast(entry) {
    const id = entry.instance_id;
    const loaded = state.rounds.get(id);
    const title = h("h3", {}, t("serving.past"));
    const error =
      loaded?.error || state.downloadError?.instance === id
        ? h(
            "p",
            { class: "error", role: "status" },
            loaded?.error
              ? errorMessage(loaded.error)
              : t("serving.error.download", { detail: errorMessage(state.downloadError.error) }),
          )
        : null;
    const rounds = pastRounds(loaded?.data ?? [], state.finished);
    if (rounds.length === 0) return [title, error, h("p", { class: "empty" }, t("serving.past.empty"))];
    const picked = state.picked.get(id);
    return [
      title,
      error,
      table(
        t("serving.past"),
        [
          t("serving.past.col.id"),
          t("serving.past.col.kind"),
          t("serving.past.col.started"),
          t("serving.past.col.outcome"),
          t("serving.past.col.total"),
          t("serving.past.col.actions"),
        ],
        rounds.map((r) =>
          h(
            "tr",
            {
              dataset: { request: r.requestId, outcome: r.outcome ?? "running" },
              class: r.requestId === picked ? "selected" : null,
            },
            h("td", { class: "round-id" }, h("code", {}, r.requestId)),
            h("td", {}, known(`serving.kind.${r.kind}`, r.kind)),
            h("td", { class: "nowrap" }, fmtSeconds(r.startedAt)),
            h("td", {}, outcomeBadge(r.outcome, r.tone)),
            h(
              "td",
              { class: "num duration" },
              r.totalSec !== null
                ? t("serving.seconds", { sec: r.totalSec.toFixed(3) })
                : r.outcome == null
                  ? t("serving.round.running")
                  : t("unknown"),
            ),
            h(
              "td",
              { class: "actions" },
              h(
                "div",
                { class: "round-actions" },
                h(
                  "button",
                  { type: "button", class: "round-show", id: `round-show-${r.requestId}`, onclick: () => pick(id, r.requestId) },
                  t("serving.past.show"),
                ),
                h(
                  "button",
                  {
                    type: "button",
                    class: "round-download",
                    id: `round-download-${r.requestId}`,
                    "aria-label": t("serving.past.download_label", { id: r.requestId }),
                    onclick: () => download(entry, r.requestId),
                  },
                  t("serving.past.download"),
                ),
              ),
            ),
          ),
        ),
        { class: "rounds" },
      ),
    ];
  }

  function renderInstance(entry) {
    const phase = phaseInfo(entry.phase);
    const serving = entry.can_serve === true;
    return h(
      "section",
      {
        class: entry.instance_id === state.linked ? "block instance linked" : "block instance",
        "aria-current": entry.instance_id === state.linked ? "true" : null,
        dataset: { instance: entry.instance_id, phase: String(entry.phase) },
      },
      h(
        "div",
        { class: "block-head" },
        h("h2", {}, t("serving.instance", { id: entry.instance_id })),
        h(
          "a",
          {
            class: "instance-link small",
            href: `/serving?instance=${encodeURIComponent(entry.instance_id)}`,
            title: t("serving.instance_link_title", { id: entry.instance_id }),
          },
          t("serving.instance_link"),
        ),
        h(
          "div",
          { class: "badges" },
          h(
            "span",
            { class: `badge phase tone-${phase.tone}`, title: t("serving.phase.label") },
            phase.known ? t(phase.name) : `${t(phase.name)}: ${entry.phase}`,
            phase.known ? h("code", { class: "phase-code" }, entry.phase) : null,
          ),
          h(
            "span",
            { class: `badge can-serve ${serving ? "tone-ok" : "tone-bad"}` },
            serving ? t("serving.can_serve") : t("serving.cannot_serve"),
          ),
          entry.serving_published === undefined
            ? null
            : h(
                "span",
                { class: `badge published ${entry.serving_published ? "tone-ok" : "tone-warn"}` },
                entry.serving_published ? t("serving.published") : t("serving.unpublished"),
              ),
        ),
      ),
      h("p", { class: "phase-explain" }, t(phase.explain)),
      renderRanks(entry),
      renderFacts(entry),
      renderGate(entry),
      renderErrors(entry),
      renderHardware(entry),
      renderPods(entry),
      renderTimeline(entry),
      renderPast(entry),
    );
  }

  function renderList() {
    if (state.status === null) {
      if (state.error) return replace(listBox);
      return replace(listBox, h("p", { class: "block muted", role: "status" }, t("loading")));
    }
    if (state.status.length === 0) {
      return replace(listBox, h("p", { class: "block empty", id: "serving-empty" }, t("serving.empty")));
    }
    replace(listBox, state.status.map(renderInstance));
    if (state.linked && !state.scrolledToLinked) {
      const linked = [...listBox.querySelectorAll("section.instance")].find((el) => el.dataset.instance === state.linked);
      if (linked) {
        state.scrolledToLinked = true; // once: later refreshes never move the reader
        linked.scrollIntoView({ block: "start" });
      }
    }
  }

  function render() {
    renderHead();
    renderList();
  }

  return {
    start() {
      replace(main, headBox, listBox);
      render();
      document.addEventListener("visibilitychange", onVisibility);
      tick();
    },
    render,
    stop() {
      state.stopped = true;
      clearTimeout(state.timer);
      state.timer = null;
      document.removeEventListener("visibilitychange", onVisibility);
    },
  };
}
