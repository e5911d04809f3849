// /nodes/gpu-health: statistics, predictions, ECC rate, capability matrix — top to bottom, as the page table of
// docs/design/gpu-health-design.md describes. Data is fetched on load and on interaction; an auto-refresh every minute is opt-in (a checkbox,
// ?refresh=1). The URL carries the view (source, prediction filters, sort, search, page, selected card, and the
// capability matrix's own filters, order and page).
import { api, download } from "../api.js";
import { h, replace } from "../dom.js";
import { fmtNumber, fmtPercent, fmtTime } from "../format.js";
import { LANGUAGES, t } from "../i18n.js";
import { recogniseTypes } from "../logic/labels.js";
import { DEFAULT_RANGE, RANGES } from "../logic/axis.js";
import {
  SORTS,
  STATUSES,
  TYPES,
  capabilityExportHref,
  capabilityParams,
  parseNodeLink,
  parseView,
  predictionParams,
  writeView,
} from "../logic/query.js";
import { statsCardState } from "../logic/stats.js";
import { eccChart } from "./ecc_chart.js";
import { PAGE_SIZE, renderCapabilityMatrix } from "./capability_matrix.js";
import { codedText, evidenceLinesText } from "../logic/api_text.js";
import { activatable, allNodes, apiCoded, apiTr, blockStatus, choice, idle, loading, pager, searchForm, table } from "./common.js";

export const SAMPLE_LIMIT = 20000;
const DEFAULT_STALL_MINUTES = 60;
export const AUTO_REFRESH_MS = 60_000;

const cardKey = (nodeId, index) => `${nodeId}|${index}`;

/**
 * An API text in the page's language: the API sends a stable code with each text (``note_code``,
 * ``disclaimer_code``); a code the dictionary knows is shown in the chosen language with the response's own
 * parameters, anything else verbatim as the API wrote it.
 */
function apiText(body, field) {
  const code = body[`${field}_code`];
  const key = typeof code === "string" ? `api.${code}` : null;
  if (key && key in LANGUAGES.en) {
    return t(key, { min_matured: body.min_matured, min_span: body.min_span_days });
  }
  return body[field];
}

/** The API's reasons for a band ({code, params, text} each), in the page's language. */
function reasonsText(reasons) {
  return reasons.map((r) => codedText(r, apiTr)).join("; ");
}

export function createGpuHealthPage(main) {
  const view = parseView(location.search);
  let linkedCard = view.card === null ? parseNodeLink(location.search) : null; // from the serving dashboard
  const state = {
    source: view.source,
    // Bumped on every source switch: a response for an older generation is discarded when it arrives.
    gen: 0,
    predsGen: 0,
    samplesGen: 0,
    filter: view.status,
    type: view.type,
    sort: view.sort,
    q: view.q,
    offset: (view.page - 1) * PAGE_SIZE,
    selected: view.card, // {node_id, gpu_index}
    cardInUrl: view.card !== null, // the default card is not written to the URL; a chosen one is
    refresh: view.refresh,
    range: view.range,
    stalledOnly: view.stalled,
    // the capability matrix's own filters, order and page; its rows come from their own paged call
    capsQ: view.cq,
    capsNode: view.cnode,
    capsUnknown: view.cunknown,
    capsSort: view.csort,
    capsOffset: (view.cpage - 1) * PAGE_SIZE,
    matrix: loading(),
    matrixGen: 0,
    refreshTimer: null,
    asOf: null, // when the data on screen was read (the newest answer of the API)
    stats: loading(),
    preds: loading(),
    caps: loading(),
    nodes: loading(),
    samples: idle(),
    xids: idle(), // the selected card's XID events in the chart's period
  };

  const banner = document.getElementById("sim-banner");
  const calibrationText = document.getElementById("calibration-text");
  const sourceBox = h("div", { class: "source-switch" });
  const asOfBox = h("div", { class: "as-of", id: "as-of" });
  const statsBox = h("section", { id: "stats", class: "block", "aria-labelledby": "stats-title" });
  const predsBox = h("section", { id: "predictions", class: "block", "aria-labelledby": "pred-title" });
  const eccBox = h("section", { id: "ecc", class: "block", "aria-labelledby": "ecc-title" });
  const capsBox = h("section", { id: "capabilities", class: "block", "aria-labelledby": "caps-title" });

  const nodeName = (id) => {
    const node = state.nodes.status === "ok" ? state.nodes.data.get(id) : null;
    return node ? node.name : id.slice(0, 8);
  };
  const simBadge = () => (state.source === "simulated" ? h("span", { class: "badge sim" }, t("sim.badge")) : null);

  function currentView() {
    return {
      source: state.source,
      status: state.filter,
      type: state.type,
      sort: state.sort,
      q: state.q,
      page: Math.floor(state.offset / PAGE_SIZE) + 1,
      card: state.cardInUrl ? state.selected : null,
      refresh: state.refresh,
      range: state.range,
      stalled: state.stalledOnly,
      cq: state.capsQ,
      cnode: state.capsNode,
      cunknown: state.capsUnknown,
      csort: state.capsSort,
      cpage: Math.floor(state.capsOffset / PAGE_SIZE) + 1,
    };
  }

  function writeUrl() {
    history.replaceState(null, "", `${location.pathname}${writeView(currentView())}${location.hash}`);
  }

  function scheduleRefresh() {
    clearInterval(state.refreshTimer);
    state.refreshTimer = state.refresh ? setInterval(() => fetchAll({ quiet: true }), AUTO_REFRESH_MS) : null;
  }

  // ---- fetching -------------------------------------------------------------------------------------------
  function fetchAll({ quiet = false } = {}) {
    const gen = state.gen;
    const source = state.source;
    const apply = (fn) => (value) => {
      if (gen !== state.gen) return; // a late response for the previous source: never shown
      fn(value);
    };
    api("/api/v1/gpu-health/prediction-stats", { params: { source } }).then(
      apply((data) => {
        state.asOf = new Date();
        setBlock("stats", { status: "ok", data });
      }),
      apply((error) => setBlock("stats", { status: "error", error })),
    );
    fetchPredictions({ quiet });
    fetchMatrix({ quiet });
    Promise.all([api("/api/v1/gpu-health/capabilities", { params: { source } }), allNodes()]).then(
      apply(([caps, nodes]) => {
        state.nodes = { status: "ok", data: new Map(nodes.map((n) => [n.id, n])) };
        state.caps = { status: "ok", data: caps };
        const linked = linkedCard
          ? (nodes.find((n) => n.name === linkedCard.node && n.source === source) ??
            nodes.find((n) => n.name === linkedCard.node))
          : null;
        if (linked && linked.source !== source) {
          // a link names the node, not its source: open the node's own source, whose answer selects the card
          switchSource(linked.source);
          return;
        }
        if (linked) selectCard({ node_id: linked.id, gpu_index: linkedCard.gpu }, { scroll: false, remember: true });
        linkedCard = null; // once: a refresh or a source switch never jumps back to it
        if (!state.selected) {
          const first = orderedCards().find(
            (c) => c.metrics.ecc_corrected_total === "collectable" || c.metrics.ecc_uncorrected_total === "collectable",
          );
          if (first) selectCard({ node_id: first.node_id, gpu_index: first.gpu_index }, { scroll: false, remember: false });
        } else if (quiet) {
          selectCard(state.selected, { scroll: false, remember: state.cardInUrl, quiet: true });
        }
        state.asOf = new Date();
        renderAll();
      }),
      apply((error) => {
        state.caps = { status: "error", error };
        state.nodes = { status: "error", error };
        renderAll();
      }),
    );
  }

  function fetchPredictions({ quiet = false } = {}) {
    const gen = state.gen;
    const predsGen = ++state.predsGen;
    writeUrl();
    if (!quiet || state.preds.status !== "ok") {
      state.preds = loading(); // a refresh keeps the rows on screen until the new ones arrive
      renderPredictions();
    }
    const params = predictionParams(currentView(), PAGE_SIZE);
    const current = () => gen === state.gen && predsGen === state.predsGen;
    api("/api/v1/gpu-health/predictions", { params }).then(
      (data) => {
        if (!current()) return;
        state.asOf = new Date();
        setBlock("preds", { status: "ok", data });
      },
      (error) => current() && setBlock("preds", { status: "error", error }),
    );
  }

  /** The matrix's page: filtered (stalled only, node, search), ordered and paged by the API. */
  function fetchMatrix({ quiet = false } = {}) {
    const gen = state.gen;
    const matrixGen = ++state.matrixGen;
    writeUrl();
    if (!quiet || state.matrix.status !== "ok") {
      state.matrix = loading();
      renderCapabilities();
    }
    const current = () => gen === state.gen && matrixGen === state.matrixGen;
    api("/api/v1/gpu-health/capabilities", { params: capabilityParams(currentView(), PAGE_SIZE) }).then(
      (data) => current() && setBlock("matrix", { status: "ok", data }),
      (error) => current() && setBlock("matrix", { status: "error", error }),
    );
  }

  function refilterMatrix(change) {
    change();
    state.capsOffset = 0; // a new filter or order starts on the first page
    fetchMatrix();
  }

  function selectCard(card, { scroll = true, remember = true, quiet = false } = {}) {
    state.selected = card;
    state.cardInUrl = remember;
    writeUrl();
    const gen = state.gen;
    const samplesGen = ++state.samplesGen;
    if (!quiet || state.samples.status !== "ok") state.samples = loading();
    const since = new Date(Date.now() - state.range * 86_400_000).toISOString();
    const params = { source: state.source, node_id: card.node_id, gpu_index: card.gpu_index, limit: SAMPLE_LIMIT, since };
    const current = () => gen === state.gen && samplesGen === state.samplesGen;
    api("/api/v1/gpu-health/samples", { params }).then(
      (data) => current() && setBlock("samples", { status: "ok", data, fetchedAt: Date.now() }),
      (error) => current() && setBlock("samples", { status: "error", error }),
    );
    if (!quiet || state.xids.status !== "ok") state.xids = loading();
    const xidParams = { source: state.source, node_id: card.node_id, gpu_index: card.gpu_index, since, limit: 200 };
    api("/api/v1/gpu-health/xid-events", { params: xidParams }).then(
      (data) => current() && setBlock("xids", { status: "ok", data }),
      (error) => current() && setBlock("xids", { status: "error", error }),
    );
    renderPredictions();
    renderEcc();
    if (scroll) {
      // From a prediction row: show the chart and put keyboard focus on the card selector next to it.
      eccBox.scrollIntoView({ block: "start" });
      document.getElementById("ecc-card")?.focus({ preventScroll: true });
    }
  }

  function switchSource(source) {
    if (source === state.source) return;
    // Clear every block and the selected card first, so the two data sets never show together.
    state.source = source;
    state.gen += 1;
    state.offset = 0;
    state.capsOffset = 0;
    state.capsNode = ""; // a node of the other source
    state.matrix = loading();
    state.selected = null;
    state.cardInUrl = false;
    state.stats = loading();
    state.preds = loading();
    state.caps = loading();
    state.nodes = loading();
    state.samples = idle();
    state.xids = idle();
    writeUrl();
    renderAll();
    fetchAll();
  }

  function setBlock(name, value) {
    state[name] = value;
    renderAll();
  }

  // ---- rendering ------------------------------------------------------------------------------------------
  function renderShell() {
    document.body.classList.toggle("simulated", state.source === "simulated");
    banner.hidden = state.source !== "simulated";
    banner.textContent = t("sim.banner");
    // The calibration notice never disappears: the API's disclaimer verbatim when we have it, else local text.
    const disclaimer = state.stats.status === "ok" ? apiText(state.stats.data, "disclaimer") : null;
    calibrationText.textContent = typeof disclaimer === "string" && disclaimer ? disclaimer : t("calibration.fallback");
    calibrationText.dataset.origin = typeof disclaimer === "string" && disclaimer ? "api" : "fallback";
    const option = (value) =>
      h(
        "label",
        { class: value === state.source ? "seg active" : "seg" },
        h("input", {
          type: "radio",
          name: "source",
          id: `source-${value}`,
          value,
          checked: value === state.source,
          onchange: () => switchSource(value),
        }),
        t(`source.${value}`),
      );
    replace(
      sourceBox,
      h("fieldset", {}, h("legend", {}, t("source.label")), option("real"), option("simulated")),
    );
    replace(
      asOfBox,
      h(
        "p",
        { class: "muted small", id: "as-of-time" },
        state.asOf ? t("asof", { time: fmtTime(state.asOf.toISOString()) }) : t("loading"),
      ),
      h(
        "label",
        { class: "small refresh-toggle" },
        h("input", {
          type: "checkbox",
          id: "auto-refresh",
          checked: state.refresh,
          onchange: (event) => {
            state.refresh = event.target.checked;
            writeUrl();
            scheduleRefresh();
          },
        }),
        " ",
        t("refresh.auto", { seconds: AUTO_REFRESH_MS / 1000 }),
      ),
    );
  }

  function renderStats() {
    const title = h("h2", { id: "stats-title" }, t("stats.title"), simBadge());
    const status = blockStatus(state.stats);
    if (status) return replace(statsBox, title, status);
    const stats = state.stats.data;
    const bands = [...stats.windows].sort((a, b) => a.window_days - b.window_days);
    replace(statsBox, title, h("div", { class: "stat-cards" }, bands.map((band) => statCard(band, stats))));
  }

  function statCard(band, stats) {
    const cs = statsCardState(band, stats);
    const pair = (label, value, key, cls = null) => [h("dt", {}, label), h("dd", { dataset: { key }, class: cls }, value)];
    const reasonText = (r) => {
      if (r.code === "matured") return t("stats.reason.matured", { matured: r.matured, min: r.min });
      if (r.code === "span") return t("stats.reason.span", { span: fmtNumber(r.span, 1), min: r.min });
      if (r.code === "span_unknown") return t("stats.reason.span_unknown", { min: r.min });
      return `${t("stats.reason.api")} ${reasonsText(cs.apiReasons)}`;
    };
    const head = cs.sufficient
      ? h(
          "dl",
          { class: "ratios" },
          pair(t("stats.precision"), fmtPercent(cs.precision), "precision"),
          pair(
            t("stats.recall"),
            cs.recall === null ? t("stats.recall_undefined") : fmtPercent(cs.recall),
            "recall",
            cs.recall === null ? "words" : null,
          ),
        )
      : h(
          "div",
          { class: "insufficient", role: "status" },
          h("strong", {}, t("stats.insufficient")),
          h("ul", {}, cs.reasons.map((r) => h("li", {}, reasonText(r)))),
        );
    const span = stats.span_days === null || stats.span_days === undefined ? t("unknown") : t("stats.days", { n: fmtNumber(stats.span_days, 1) });
    return h(
      "article",
      { class: "stat-card", dataset: { band: band.window_days, state: cs.sufficient ? "sufficient" : "insufficient" } },
      h("h3", {}, t("stats.band", { n: band.window_days })),
      head,
      h(
        "dl",
        { class: "counts", "aria-label": t("stats.counts") },
        pair(t("stats.pending"), fmtNumber(band.pending), "pending"),
        pair(t("stats.hit"), fmtNumber(band.hit), "hit"),
        pair(t("stats.miss"), fmtNumber(band.miss), "miss"),
        pair(t("stats.voided"), fmtNumber(band.voided), "voided"),
      ),
      h(
        "dl",
        { class: "counts" },
        pair(t("stats.failed_cards"), fmtNumber(band.failed_cards), "failed_cards"),
        pair(t("stats.predicted_cards"), fmtNumber(band.predicted_cards), "predicted_cards"),
        pair(t("stats.missed_cards"), fmtNumber(band.missed_cards), "missed_cards"),
      ),
      h(
        "dl",
        { class: "counts" },
        pair(t("stats.monitorable"), fmtNumber(stats.monitorable_cards), "monitorable_cards"),
        pair(t("stats.card_days"), fmtNumber(stats.card_days, 1), "card_days"),
        pair(t("stats.span"), span, "span_days"),
      ),
      firstFailures(band.first_failure, stats, pair),
      cs.sufficient && cs.apiReasons.length
        ? h("p", { class: "muted small" }, `${t("stats.notes")}: ${reasonsText(cs.apiReasons)}`)
        : null,
    );
  }

  // The same band for first failures only (cards without an earlier uncorrectable error), through the same gate.
  function firstFailures(first, stats, pair) {
    if (!first) return null;
    const fs = statsCardState(first, stats);
    const ratio = (value) => (fs.sufficient ? (value === null ? t("unknown") : fmtPercent(value)) : t("stats.first_failure.insufficient"));
    return h(
      "div",
      { dataset: { part: "first_failure" } },
      h("p", { class: "muted small" }, t("stats.first_failure")),
      // two pairs a row: four would not fit a narrow card
      h(
        "dl",
        { class: "counts", "aria-label": t("stats.first_failure") },
        pair(t("stats.precision"), ratio(fs.precision), "first_failure_precision"),
        pair(t("stats.recall"), ratio(fs.recall), "first_failure_recall"),
      ),
      h(
        "dl",
        { class: "counts" },
        pair(t("stats.failed_cards"), fmtNumber(first.failed_cards), "first_failure_failed_cards"),
        pair(t("stats.predicted_cards"), fmtNumber(first.predicted_cards), "first_failure_predicted_cards"),
      ),
    );
  }

  function refilter(change) {
    change();
    state.offset = 0; // a new filter or sort always starts on the first page
    fetchPredictions();
  }

  async function exportCsv() {
    const params = predictionParams(currentView(), PAGE_SIZE);
    delete params.limit;
    delete params.offset;
    try {
      await download("/api/v1/gpu-health/predictions.csv", { params, filename: `heteroflow-predictions-${state.source}.csv` });
      state.csvError = null;
    } catch (error) {
      state.csvError = error;
    }
    renderPredictions();
  }

  function renderPredictions() {
    const search = searchForm("pred", state.q, (value) => refilter(() => (state.q = value)));
    const head = h(
      "div",
      { class: "block-head" },
      h("h2", { id: "pred-title" }, t("pred.title"), simBadge()),
      h(
        "div",
        { class: "controls" },
        choice(
          "pred-filter",
          STATUSES.map((s) => ({ value: s, label: t(`pred.filter.${s}`) })),
          state.filter,
          "pred.filter",
          (v) => refilter(() => (state.filter = v)),
        ),
        choice(
          "pred-type",
          TYPES.map((v) => ({ value: v, label: t(`pred.type.${v}`) })),
          state.type,
          "pred.type",
          (v) => refilter(() => (state.type = v)),
        ),
        choice(
          "pred-sort",
          SORTS.map((v) => ({ value: v, label: t(`pred.sort.${v}`) })),
          state.sort,
          "pred.sort",
          (v) => refilter(() => (state.sort = v)),
        ),
        search,
        h("button", { type: "button", id: "pred-csv", onclick: exportCsv }, t("pred.csv")),
      ),
    );
    const csvError = state.csvError
      ? h("p", { class: "error", role: "alert", id: "pred-csv-error" }, t("pred.csv_failed", { detail: state.csvError.detail ?? String(state.csvError) }))
      : null;
    const status = blockStatus(state.preds);
    if (status) return replace(predsBox, head, csvError, status);
    const body = state.preds.data;
    if (body.total === 0 || body.items.length === 0) {
      const filtered = state.filter !== "all" || state.type !== "all" || state.q;
      return replace(
        predsBox,
        head,
        csvError,
        filtered ? h("p", { class: "empty", id: "pred-empty-filtered" }, t("pred.empty_filtered")) : null,
        h(
          "p",
          { class: "empty", id: "pred-empty" },
          t("pred.empty"),
          " ",
          h("a", { href: "#capabilities" }, t("pred.empty_link")),
        ),
        predsPager(body),
      );
    }
    // A re-render (e.g. when the capability matrix arrives) must not take keyboard focus away from a row.
    const focusedId = document.activeElement?.closest?.("#pred-table tr")?.dataset?.id;
    const rows = body.items.map((p) => predictionRow(p, body.current_rule_version));
    replace(
      predsBox,
      head,
      csvError,
      h("p", { class: "muted small" }, t("pred.select_hint")),
      table(
        t("pred.title"),
        [
          t("pred.col.card"),
          t("pred.col.type"),
          t("pred.col.status"),
          t("pred.col.window"),
          t("pred.col.rule"),
          t("pred.col.evidence"),
        ],
        rows,
        { id: "pred-table" },
      ),
      predsPager(body),
    );
    if (focusedId) rows.find((row) => row.dataset.id === focusedId)?.focus({ preventScroll: true });
  }

  function predictionRow(p, currentRule) {
    const types = recogniseTypes(p.evidence);
    const selected =
      state.selected && state.selected.node_id === p.node_id && state.selected.gpu_index === p.gpu_index;
    const row = h(
      "tr",
      { class: selected ? "selected" : null, "aria-selected": selected ? "true" : "false", dataset: { id: p.id } },
      h(
        "td",
        {},
        h("span", { class: "card-name" }, `${nodeName(p.node_id)} #${p.gpu_index}`),
        h("br"),
        h("code", { class: "uuid" }, p.uuid ?? t("unknown")),
      ),
      h(
        "td",
        { class: "types" },
        types.length
          ? types.map((code) => h("span", { class: "badge type", dataset: { type: code } }, t(`type.${code}`)))
          : h("span", { class: "badge type unrecognised", dataset: { type: "unrecognised" } }, t("type.unrecognised")),
      ),
      h("td", {}, h("span", { class: `badge status-${p.status}` }, t(`status.${p.status}`))),
      h("td", { class: "nowrap" }, fmtTime(p.t0), " → ", h("br"), fmtTime(p.window_end), ` (${p.window_days} d)`),
      h(
        "td",
        {},
        h("code", {}, p.rule_version),
        p.rule_version !== currentRule
          ? h("span", { class: "muted small" }, ` (${t("pred.rule_old", { current: currentRule })})`)
          : null,
      ),
      h(
        "td",
        { class: "evidence" },
        h("pre", {}, evidenceLinesText(p, apiTr)),
        p.conclusion
          ? h(
              "p",
              { class: "conclusion", dataset: { code: p.conclusion_code?.code ?? "" } },
              `${t("pred.conclusion")}: ${apiCoded(p.conclusion_code, p.conclusion)}`,
            )
          : null,
      ),
    );
    return activatable(row, () => selectCard({ node_id: p.node_id, gpu_index: p.gpu_index }));
  }

  function predsPager(body) {
    return pager("pred", body, PAGE_SIZE, (delta) => {
      state.offset = Math.max(0, state.offset + delta * PAGE_SIZE);
      fetchPredictions();
    });
  }

  /** The capability rows grouped by node (insertion order), the order the selector and the matrix use. */
  function orderedCards() {
    if (state.caps.status !== "ok") return [];
    const groups = new Map();
    for (const card of state.caps.data.cards) {
      if (!groups.has(card.node_id)) groups.set(card.node_id, []);
      groups.get(card.node_id).push(card);
    }
    // Grouped per node, nodes by name, cards by index: a stable order for the matrix and the default card.
    const byName = (a, b) => nodeName(a).localeCompare(nodeName(b)) || a.localeCompare(b);
    return [...groups.keys()]
      .sort(byName)
      .flatMap((id) => groups.get(id).sort((a, b) => a.gpu_index - b.gpu_index));
  }

  function renderEcc() {
    const title = h("h2", { id: "ecc-title" }, t("ecc.title"), simBadge());
    const status = blockStatus(state.caps);
    if (status) return replace(eccBox, title, status);
    const options = new Map();
    for (const c of orderedCards()) {
      const key = cardKey(c.node_id, c.gpu_index);
      if (!options.has(key)) options.set(key, `${nodeName(c.node_id)} #${c.gpu_index} · ${c.uuid ?? t("unknown")}`);
    }
    if (state.selected) {
      const key = cardKey(state.selected.node_id, state.selected.gpu_index);
      if (!options.has(key)) options.set(key, `${nodeName(state.selected.node_id)} #${state.selected.gpu_index}`);
    }
    if (options.size === 0) return replace(eccBox, title, h("p", { class: "empty" }, t("ecc.no_cards")));
    const selectedKey = state.selected ? cardKey(state.selected.node_id, state.selected.gpu_index) : "";
    const select = h(
      "select",
      {
        id: "ecc-card",
        onchange: (event) => {
          const [nodeId, index] = event.target.value.split("|");
          if (nodeId) selectCard({ node_id: nodeId, gpu_index: Number(index) }, { scroll: false });
        },
      },
      selectedKey ? null : h("option", { value: "", selected: true }, "—"),
      [...options].map(([key, label]) => h("option", { value: key, selected: key === selectedKey }, label)),
    );
    // type-ahead over every card: a datalist of the same labels (a thousand entries are not scrolled through)
    const byLabel = new Map([...options].map(([key, label]) => [label, key]));
    const finder = h("input", {
      id: "ecc-card-find",
      type: "search",
      list: "ecc-card-list",
      autocomplete: "off",
      placeholder: t("ecc.card_find_placeholder"),
      "aria-label": t("ecc.card_find"),
      onchange: (event) => {
        const key = byLabel.get(event.target.value);
        if (!key) return;
        const [nodeId, index] = key.split("|");
        selectCard({ node_id: nodeId, gpu_index: Number(index) }, { scroll: false });
      },
    });
    const datalist = h("datalist", { id: "ecc-card-list" }, [...options].map(([, label]) => h("option", { value: label })));
    const range = h(
      "select",
      {
        id: "ecc-range",
        onchange: (event) => {
          state.range = Number(event.target.value);
          if (state.selected) selectCard(state.selected, { scroll: false, remember: state.cardInUrl });
          else writeUrl();
        },
      },
      RANGES.map((days) => h("option", { value: String(days), selected: days === state.range }, t("ecc.range.days", { days }))),
    );
    const head = h(
      "div",
      { class: "block-head" },
      title,
      h(
        "div",
        { class: "controls" },
        h("div", { class: "control" }, h("label", { for: "ecc-card" }, t("ecc.card")), select),
        h("div", { class: "control search" }, finder, datalist),
        h("div", { class: "control" }, h("label", { for: "ecc-range" }, t("ecc.range")), range),
      ),
    );
    const sampleStatus = blockStatus(state.samples);
    if (state.samples.status === "idle") return replace(eccBox, head);
    if (sampleStatus) return replace(eccBox, head, sampleStatus);
    const data = state.samples.data;
    const staleMinutes = state.caps.data.stall_threshold_minutes ?? DEFAULT_STALL_MINUTES;
    const chartOpts = {
      samples: data.samples,
      fromMs: Date.parse(data.since),
      untilMs: state.samples.fetchedAt,
      staleMinutes,
      truncated: Boolean(data.truncated),
    };
    replace(
      eccBox,
      head,
      data.truncated
        ? h("p", { class: "warning", role: "alert", id: "ecc-truncated" }, t("ecc.truncated", { count: data.samples.length }))
        : null,
      h("p", { class: "muted small" }, t("ecc.legend")),
      h(
        "div",
        { class: "charts" },
        eccChart({ ...chartOpts, key: "ecc_corrected_total", title: t("ecc.corrected") }),
        eccChart({ ...chartOpts, key: "ecc_uncorrected_total", title: t("ecc.uncorrected") }),
      ),
      xidEvents(),
    );
  }

  /** The selected card's XID events in the period; when the node does not collect them, that, never "none". */
  function xidEvents() {
    const title = h("h3", { id: "xid-title" }, t("xid.card_title"));
    const status = blockStatus(state.xids);
    if (state.xids.status === "idle") return null;
    if (status) return h("section", { id: "card-xids" }, title, status);
    const { events, truncated } = state.xids.data;
    const selected = state.selected;
    const capability =
      state.caps.status === "ok" && selected
        ? state.caps.data.cards.find((c) => c.node_id === selected.node_id && c.gpu_index === selected.gpu_index)
        : null;
    const collection = capability?.xid_events ?? "unknown";
    const empty =
      collection === "collected"
        ? t("xid.none")
        : t(`xid.collection.${collection === "not_collected" || collection === "lost" ? collection : "unknown"}`, {
            reason: capability?.xid_events_reason ?? t("unknown"),
          });
    return h(
      "section",
      { id: "card-xids", dataset: { collection } },
      title,
      events.length === 0
        ? h("p", { class: "muted", id: "xid-empty" }, empty)
        : table(
            t("xid.card_title"),
            [t("xid.col.at"), t("xid.col.xid"), t("xid.col.uuid")],
            events.map((e) =>
              h(
                "tr",
                { dataset: { xid: e.xid } },
                h("td", { class: "nowrap" }, fmtTime(e.occurred_at)),
                h("td", {}, h("span", { class: "badge xid" }, `XID ${e.xid}`)),
                h("td", {}, h("code", {}, e.uuid ?? t("unknown"))),
              ),
            ),
            { id: "xid-table" },
          ),
      truncated ? h("p", { class: "muted small" }, t("xid.truncated", { count: events.length })) : null,
    );
  }

  function renderCapabilities() {
    renderCapabilityMatrix(capsBox, {
      state,
      title: h("h2", { id: "caps-title" }, t("caps.title"), simBadge()),
      nodeName,
      orderedCards: orderedCards(),
      noteText: (caps) => apiText(caps, "note"),
      refilter: refilterMatrix,
      exportHref: capabilityExportHref(currentView()),
      turnPage: (delta) => {
        state.capsOffset = Math.max(0, state.capsOffset + delta * PAGE_SIZE);
        fetchMatrix();
      },
    });
  }

  function renderAll() {
    renderShell();
    renderStats();
    renderPredictions();
    renderEcc();
    renderCapabilities();
  }

  return {
    start() {
      replace(main, sourceBox, asOfBox, statsBox, predsBox, eccBox, capsBox);
      renderAll();
      fetchAll();
      if (state.selected) selectCard(state.selected, { scroll: false, remember: true });
      scheduleRefresh();
    },
    render: renderAll,
    stop() {
      state.gen += 1;
      clearInterval(state.refreshTimer);
      document.body.classList.remove("simulated");
      banner.hidden = true;
    },
  };
}
