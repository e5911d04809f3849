// /nodes: the nodes in the caller's scope with online state and GPU counts; per-GPU sparklines on demand (one
// request per node the user opens, never one per listed node).
import { api } from "../api.js";
import { h, replace } from "../dom.js";
import { fmtNumber, fmtTime } from "../format.js";
import { t } from "../i18n.js";
import { cardsInfo, credentialInfo, toolStalls } from "../logic/nodes.js";
import { blockStatus, loading, table } from "./common.js";
import { gpuSparklines } from "./sparklines.js";

const LIMIT = 1000;
const RANGE_HOURS = [1, 24, 168]; // and the server's whole retention, which its first answer names

export function createNodesPage(main) {
  // node id -> its metrics block; node id -> its XID events (last 7 days)
  const state = { nodes: loading(), gen: 0, open: new Map(), xids: new Map(), hours: new Map(), retentionDays: null };
  const box = h("section", { class: "block", "aria-labelledby": "nodes-title" });

  function fetchNodes() {
    const gen = ++state.gen;
    api("/api/v1/nodes", { params: { limit: LIMIT } }).then(
      (data) => gen === state.gen && ((state.nodes = { status: "ok", data }), render()),
      (error) => gen === state.gen && ((state.nodes = { status: "error", error }), render()),
    );
  }

  function render() {
    const title = h("h1", { id: "nodes-title" }, t("nodes.title"));
    const status = blockStatus(state.nodes);
    if (status) return replace(box, title, status);
    const body = state.nodes.data;
    const rows = body.items.map((n) =>
      h(
        "tr",
        { dataset: { node: n.id, online: String(n.online) } },
        h("td", {}, h("span", { class: "card-name" }, n.name), h("br"), h("code", { class: "uuid" }, n.id)),
        h("td", {}, n.vendor),
        h("td", {}, n.model || t("unknown")),
        h("td", { class: "num" }, fmtNumber(n.gpu_count)),
        h(
          "td",
          {},
          n.source === "simulated" ? h("span", { class: "badge sim" }, t("sim.badge")) : t("source.real"),
        ),
        h(
          "td",
          {},
          h("span", { class: n.online ? "badge online" : "badge offline" }, n.online ? t("nodes.online") : t("nodes.offline")),
        ),
        h("td", { class: "nowrap" }, fmtTime(n.last_heartbeat)),
        h("td", { class: "nowrap" }, fmtTime(n.registered_at)),
        h(
          "td",
          {},
          h(
            "button",
            {
              type: "button",
              class: "metrics-toggle",
              "aria-expanded": String(state.open.has(n.id)),
              onclick: () => toggleMetrics(n.id),
            },
            state.open.has(n.id) ? t("nodes.metrics.hide") : t("nodes.metrics.show"),
          ),
        ),
      ),
    ).flatMap((row, i) => {
      const node = body.items[i];
      const id = node.id;
      const facts = h("tr", { class: "facts-row", dataset: { factsOf: id } }, h("td", { colspan: 9 }, nodeFacts(node)));
      if (!state.open.has(id)) return [row, facts];
      return [row, facts, h("tr", { class: "metrics-row", dataset: { metricsOf: id } }, h("td", { colspan: 9 }, metricsBlock(id)))];
    });
    replace(
      box,
      title,
      rows.length === 0
        ? h("p", { class: "empty" }, t("nodes.empty"))
        : table(
            t("nodes.title"),
            [
              t("nodes.col.name"),
              t("nodes.col.vendor"),
              t("nodes.col.model"),
              t("nodes.col.gpus"),
              t("nodes.col.source"),
              t("nodes.col.state"),
              t("nodes.col.heartbeat"),
              t("nodes.col.registered"),
              t("nodes.col.metrics"),
            ],
            rows,
            { id: "nodes-table" },
          ),
      h("p", { class: "pager", id: "nodes-total" }, t("nodes.total", { shown: body.items.length, total: body.total })),
    );
  }

  /** Who speaks for the node, what it may report and what was refused, and its stalled vendor tools: one line each. */
  function nodeFacts(node) {
    const item = (name, label, ...value) =>
      h("li", { dataset: { fact: name } }, h("span", { class: "fact-label" }, `${label}: `), ...value);
    const cred = credentialInfo(node.credential);
    let credText;
    if (cred === null) credText = t("unknown");
    else if (cred.state === "issued") credText = t("nodes.cred.issued", { at: cred.issuedAt ? fmtTime(cred.issuedAt) : t("unknown") });
    else if (cred.state === "released") credText = t("nodes.cred.released", { at: cred.releasedAt ? fmtTime(cred.releasedAt) : t("unknown") });
    else credText = t("nodes.cred.none");
    const credItem = item(
      "credential",
      t("nodes.cred"),
      h("span", { class: "cred-state", dataset: { state: cred?.state ?? "unknown" } }, credText),
      cred?.reissued ? h("span", { class: "badge reissued" }, t("nodes.cred.reissued")) : null,
    );
    const cards = cardsInfo(node.cards);
    const full = (pair) => (pair.full ? h("span", { class: "badge at-bound" }, t("nodes.cards.full")) : null);
    const cardItems = cards
      ? [
          item(
            "cards",
            t("nodes.cards"),
            t("nodes.cards.counts", { registered: fmtNumber(cards.registered), known: fmtNumber(cards.known) }),
          ),
          item(
            "hour",
            t("nodes.cards.hour"),
            t("nodes.cards.hour_counts", {
              new: fmtNumber(cards.newCards.count),
              new_bound: fmtNumber(cards.newCards.bound),
              xid: fmtNumber(cards.xidEvents.count),
              xid_bound: fmtNumber(cards.xidEvents.bound),
              per_beat: fmtNumber(cards.xidPerBeat),
            }),
            full(cards.newCards) || full(cards.xidEvents),
          ),
          h(
            "li",
            { dataset: { fact: "refused", refused: cards.refused === null ? "unknown" : String(cards.refused) }, class: cards.refused ? "refused" : null },
            h("span", { class: "fact-label" }, `${t("nodes.cards.refused")}: `),
            t("nodes.cards.refused_counts", {
              index: fmtNumber(cards.refusedIndex),
              new_card: fmtNumber(cards.refusedNewCard),
              xid: fmtNumber(cards.refusedXid),
            }),
          ),
        ]
      : [item("cards", t("nodes.cards"), t("unknown"))];
    const stalls = toolStalls(node.tool_stalls);
    const stallItem = item(
      "tool-stalls",
      t("nodes.stalls"),
      stalls.length === 0
        ? t("nodes.stalls.none")
        : stalls.map((s) =>
            h(
              "span",
              { class: "badge stalled", dataset: { tool: s.tool } },
              t(s.timeouts === null ? "nodes.stalls.item" : "nodes.stalls.timeouts", {
                tool: s.tool,
                since: s.since ? fmtTime(s.since) : t("unknown"),
                timeouts: s.timeouts === null ? "" : fmtNumber(s.timeouts),
              }),
            ),
          ),
    );
    return h(
      "ul",
      { class: "node-facts small", "aria-label": t("nodes.facts_label", { name: node.name }) },
      credItem,
      ...cardItems,
      stallItem,
    );
  }

  function metricsBlock(id) {
    const block = state.open.get(id);
    const status = blockStatus(block);
    const hours = state.hours.get(id) ?? 1;
    return [rangeChoice(id, hours), status || gpuSparklines(block.data, periodText(hours)), nodeXids(id)];
  }

  function periodText(hours) {
    return hours % 24 === 0 ? t("spark.period.days", { days: hours / 24 }) : t("spark.period.1");
  }

  /** The metrics' period: the last hour, day, week, or the whole retention the server keeps. */
  function rangeChoice(id, hours) {
    const choices = [...RANGE_HOURS];
    if (state.retentionDays && !choices.includes(state.retentionDays * 24)) choices.push(state.retentionDays * 24);
    const selectId = `metrics-range-${id}`;
    return h(
      "div",
      { class: "control metrics-range" },
      h("label", { for: selectId }, t("spark.range")),
      h(
        "select",
        { id: selectId, onchange: (event) => fetchMetrics(id, Number(event.target.value)) },
        choices.map((value) => h("option", { value: String(value), selected: value === hours }, periodText(value))),
      ),
    );
  }

  function fetchMetrics(id, hours) {
    state.hours.set(id, hours);
    state.open.set(id, loading());
    render();
    const gen = state.gen;
    const since = new Date(Date.now() - hours * 3_600_000).toISOString();
    api(`/api/v1/nodes/${encodeURIComponent(id)}/gpu-metrics`, { params: { since } }).then(
      (data) => {
        if (gen !== state.gen || !state.open.has(id) || state.hours.get(id) !== hours) return;
        if (Number.isInteger(data.retention_days)) state.retentionDays = data.retention_days;
        state.open.set(id, { status: "ok", data });
        render();
      },
      (error) =>
        gen === state.gen && state.open.has(id) && state.hours.get(id) === hours && (state.open.set(id, { status: "error", error }), render()),
    );
  }

  /** The node's XID events of the last 7 days, each with its card. */
  function nodeXids(id) {
    const block = state.xids.get(id);
    if (!block) return null;
    const title = h("h3", {}, t("xid.node_title"));
    const status = blockStatus(block);
    if (status) return h("section", { class: "node-xids", dataset: { node: id } }, title, status);
    const { events, truncated } = block.data;
    return h(
      "section",
      { class: "node-xids", dataset: { node: id } },
      title,
      events.length === 0
        ? h("p", { class: "muted" }, t("xid.node_none"))
        : table(
            t("xid.node_title"),
            [t("xid.col.at"), t("xid.col.card"), t("xid.col.xid"), t("xid.col.uuid")],
            events.map((e) =>
              h(
                "tr",
                { dataset: { xid: e.xid, gpu: e.gpu_index } },
                h("td", { class: "nowrap" }, fmtTime(e.occurred_at)),
                h("td", {}, `GPU ${e.gpu_index}`),
                h("td", {}, h("span", { class: "badge xid" }, `XID ${e.xid}`)),
                h("td", {}, h("code", {}, e.uuid ?? t("unknown"))),
              ),
            ),
          ),
      truncated ? h("p", { class: "muted small" }, t("xid.truncated", { count: events.length })) : null,
    );
  }

  function toggleMetrics(id) {
    if (state.open.has(id)) {
      state.open.delete(id);
      state.xids.delete(id);
      render();
      return;
    }
    state.xids.set(id, loading());
    fetchMetrics(id, state.hours.get(id) ?? 1);
    const gen = state.gen;
    const node = state.nodes.status === "ok" ? state.nodes.data.items.find((n) => n.id === id) : null;
    const since = new Date(Date.now() - 7 * 86_400_000).toISOString();
    const params = { node_id: id, since, limit: 50, source: node?.source === "simulated" ? "simulated" : "real" };
    api("/api/v1/gpu-health/xid-events", { params }).then(
      (data) => gen === state.gen && state.open.has(id) && (state.xids.set(id, { status: "ok", data }), render()),
      (error) => gen === state.gen && state.open.has(id) && (state.xids.set(id, { status: "error", error }), render()),
    );
  }

  return {
    start() {
      replace(main, box);
      render();
      fetchNodes();
    },
    render,
    stop() {
      state.gen += 1;
    },
  };
}
