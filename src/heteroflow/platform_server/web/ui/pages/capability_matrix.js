// The GPU health page's capability matrix: what each card can report, one page of the API's filtered, ordered
// and paged cards (stalled only, node, card search, order), grouped in runs of one node with the node's vendor
// cell. Rendering only: the page owns the state and the calls.
import { h, replace } from "../dom.js";
import { fmtNumber, fmtTime } from "../format.js";
import { t } from "../i18n.js";
import { CAPS_SORTS, CAPS_UNKNOWNS } from "../logic/query.js";
import { apiCoded, blockStatus, choice, pager, searchForm, table } from "./common.js";

export const PAGE_SIZE = 50;
export const METRICS = [
  "ecc_corrected_total",
  "ecc_uncorrected_total",
  "retired_pages",
  "remapped_rows_pending",
  "remapped_rows_failure",
  "remapped_rows_uncorrectable",
];
const cardKey = (nodeId, index) => `${nodeId}|${index}`;

/**
 * Render the matrix into ``box``. ``env``: the page's ``state`` (caps, matrix, nodes, source, stalledOnly,
 * capsNode, capsSort, capsQ), its ``title`` element, ``nodeName(id)``, the whole matrix's ``orderedCards``,
 * ``noteText(body)`` (the footer note in the page's language), ``refilter(change)``, ``turnPage(delta)`` and
 * ``exportHref`` (the CSV export of the filtered matrix).
 */
export function renderCapabilityMatrix(box, env) {
  const { state } = env;
  const capsBox = box;
  function capsControls() {
    const toggle = h(
      "label",
      { class: "control small" },
      h("input", {
        type: "checkbox",
        id: "caps-stalled",
        checked: state.stalledOnly,
        onchange: (event) => env.refilter(() => (state.stalledOnly = event.target.checked)),
      }),
      " ",
      t("caps.stalled_only"),
    );
    const nodes =
      state.nodes.status === "ok"
        ? [...state.nodes.data.values()].filter((n) => n.source === state.source).sort((a, b) => a.name.localeCompare(b.name))
        : [];
    const search = searchForm("caps", state.capsQ, (value) => env.refilter(() => (state.capsQ = value)));
    const counts = state.matrix.status === "ok" ? state.matrix.data.unknown_counts ?? {} : {};
    const counted = (m) => (m in counts ? ` (${t("caps.unknown_cards", { count: fmtNumber(counts[m]) })})` : "");
    const unknownLabel = (v) => (v === "any" ? t("caps.unknown_any") : `${t(`caps.metric.${v}`)}${counted(v)}`);
    return h(
      "div",
      { class: "controls" },
      toggle,
      choice(
        "caps-unknown",
        [{ value: "", label: t("caps.unknown_all") }, ...CAPS_UNKNOWNS.map((v) => ({ value: v, label: unknownLabel(v) }))],
        state.capsUnknown,
        "caps.unknown",
        (v) => env.refilter(() => (state.capsUnknown = v)),
      ),
      choice(
        "caps-node",
        [{ value: "", label: t("caps.node_all") }, ...nodes.map((n) => ({ value: n.id, label: n.name }))],
        state.capsNode,
        "caps.node",
        (v) => env.refilter(() => (state.capsNode = v)),
      ),
      choice(
        "caps-sort",
        CAPS_SORTS.map((v) => ({ value: v, label: t(`caps.sort.${v}`) })),
        state.capsSort,
        "caps.sort",
        (v) => env.refilter(() => (state.capsSort = v)),
      ),
      search,
      h("a", { href: env.exportHref, id: "caps-export", class: "button-link", download: "" }, t("caps.export")),
    );
  }

  /** The fleet's count of cards per counter never known (the filters but ``unknown`` apply). */
  function unknownCounts(caps) {
    const counts = caps.unknown_counts ?? {};
    const known = METRICS.filter((m) => m in counts);
    if (!known.length) return null;
    return h(
      "p",
      { class: "muted small", id: "caps-unknown-counts" },
      t("caps.unknown_counts"),
      " ",
      known.map((m, i) => [
        i ? " · " : "",
        h("span", { dataset: { metric: m, count: counts[m] } }, `${t(`caps.metric.${m}`)}: ${t("caps.unknown_cards", { count: fmtNumber(counts[m]) })}`),
      ]),
    );
  }

  function render() {
    const title = h("div", { class: "block-head" }, env.title, capsControls());
    const status = blockStatus(state.caps) ?? blockStatus(state.matrix);
    if (status) return replace(capsBox, title, status);
    const caps = state.matrix.data;
    const filtered = state.stalledOnly || Boolean(state.capsNode) || Boolean(state.capsQ) || Boolean(state.capsUnknown);
    // Slots a node reported (from the whole matrix), and the last card of each node: the "more cards" row of a
    // node follows its last card, on whichever page that card is.
    const slots = new Map();
    const lastOfNode = new Map();
    const rowKey = (c) => `${cardKey(c.node_id, c.gpu_index)}|${c.uuid ?? ""}`;
    for (const c of env.orderedCards) {
      if (!slots.has(c.node_id)) slots.set(c.node_id, new Set());
      slots.get(c.node_id).add(c.gpu_index);
      lastOfNode.set(c.node_id, rowKey(c));
    }
    // Runs of consecutive cards of one node (in the API's order): one vendor cell per run.
    const groups = [];
    for (const card of caps.cards) {
      const last = groups[groups.length - 1];
      if (last && last.nodeId === card.node_id) last.cards.push(card);
      else groups.push({ nodeId: card.node_id, cards: [card] });
    }
    // Nodes of this source without any health sample still count: all their GPUs are unknown. They follow the
    // last page of the unfiltered matrix (never "stalled": they never reported).
    const lastPage = caps.offset + caps.cards.length >= caps.total;
    if (!filtered && lastPage) {
      [...state.nodes.data.values()]
        .filter((node) => node.source === state.source && !slots.has(node.id))
        .sort((a, b) => a.name.localeCompare(b.name))
        .forEach((node) => groups.push({ nodeId: node.id, cards: [] }));
    }
    const rows = [];
    for (const { nodeId, cards } of groups) {
      const node = state.nodes.data.get(nodeId);
      const endsNode = cards.length === 0 || lastOfNode.get(nodeId) === rowKey(cards[cards.length - 1]);
      const reported = slots.get(nodeId)?.size ?? 0;
      const missing = node && !filtered && endsNode ? Math.max(0, node.gpu_count - reported) : 0;
      const span = cards.length + (missing > 0 ? 1 : 0);
      // Vendor and model are node facts: shown once per node, never matched to a single card.
      const vendorCell = h(
        "td",
        { rowspan: span, class: "vendor" },
        node ? `${node.vendor} / ${node.model || t("unknown")}` : t("unknown"),
        node ? h("br") : null,
        node ? h("span", { class: "muted small" }, t("caps.node_gpus", { gpus: node.gpu_count })) : null,
      );
      cards.forEach((card, i) => rows.push(capabilityRow(card, i === 0 ? vendorCell : null, caps)));
      if (missing > 0) {
        rows.push(
          h(
            "tr",
            { class: "more-cards", dataset: { node: nodeId, count: missing } },
            h("td", {}, h("span", { class: "card-name" }, env.nodeName(nodeId))),
            cards.length === 0 ? vendorCell : null,
            h("td", { colspan: METRICS.length + 2 }, t("caps.more_cards", { count: missing })),
          ),
        );
      }
    }
    const emptyKey = state.stalledOnly && !state.capsNode && !state.capsQ && !state.capsUnknown ? "caps.none_stalled" : filtered ? "caps.empty_filtered" : "caps.empty";
    replace(
      capsBox,
      title,
      unknownCounts(caps),
      rows.length === 0 ? h("p", { class: "empty", id: "caps-empty" }, t(emptyKey)) : null,
      rows.length === 0
        ? null
        : table(
            t("caps.title"),
            [
              t("caps.col.card"),
              t("caps.col.vendor"),
              ...METRICS.map((m) => t(`caps.metric.${m}`)),
              t("caps.col.trend"),
              t("caps.col.last"),
            ],
            rows,
            { id: "caps-table" },
          ),
      pager("caps", caps, PAGE_SIZE, env.turnPage),
      h("p", { class: "footer-note", id: "caps-note", dataset: { code: caps.note_code ?? "" } }, env.noteText(caps)),
    );
  }

  function capabilityRow(card, vendorCell, caps) {
    return h(
      "tr",
      { dataset: { node: card.node_id, index: card.gpu_index, stalled: card.collection_stalled ? "true" : "false" } },
      h(
        "td",
        {},
        h("span", { class: "card-name" }, `${env.nodeName(card.node_id)} #${card.gpu_index}`),
        card.collection_stalled
          ? h(
              "span",
              { class: "badge stalled", title: t("caps.stalled_title", { minutes: caps.stall_threshold_minutes }) },
              t("caps.stalled"),
            )
          : null,
        card.xid_events === "not_collected" || card.xid_events === "lost"
          ? h(
              "span",
              { class: "badge xid", dataset: { xid: card.xid_events }, title: card.xid_events_reason ?? "" },
              t(`caps.xid.${card.xid_events}`),
            )
          : null,
        (card.semantics_unconfirmed ?? []).length > 0
          ? h(
              "span",
              { class: "badge", title: t("caps.unconfirmed_title", { keys: card.semantics_unconfirmed.join(", ") }) },
              t("caps.unconfirmed"),
            )
          : null,
        card.ce_flood
          ? h(
              "span",
              {
                class: "badge flood",
                dataset: { flood: "true" },
                title: t("caps.flood_title", {
                  evidence: apiCoded(card.ce_flood.evidence, card.ce_flood.evidence?.text ?? ""),
                  since: fmtTime(card.ce_flood.since),
                }),
              },
              t("caps.flood"),
            )
          : null,
        h("br"),
        h("code", { class: "uuid" }, card.uuid ?? t("unknown")),
      ),
      vendorCell,
      // data-label: the column's name, shown beside the value where the matrix is one block per card (narrow)
      METRICS.map((m) =>
        card.metrics[m] === "collectable"
          ? h("td", { class: "metric yes", dataset: { metric: m, label: t(`caps.metric.${m}`) } }, t("caps.collectable"))
          : h("td", { class: "metric unknown", dataset: { metric: m, label: t(`caps.metric.${m}`) } }, t("unknown")),
      ),
      h(
        "td",
        { class: "trend", dataset: { label: t("caps.col.trend") } },
        card.trend_prediction_possible ? t("caps.trend_yes") : t("caps.trend_no"),
      ),
      h(
        "td",
        { class: "nowrap" },
        fmtTime(card.last_sample_at),
        h("br"),
        h("span", { class: "muted small" }, t("caps.samples", { count: fmtNumber(card.sample_count) })),
      ),
    );
  }

  render();
}
