// /nodes/gpu-health: statistics, predictions, ECC rate, capability matrix — top to bottom, as the page table of
// docs/design/gpu-health-design.md describes. Data is fetched on load and on interaction; an auto-refresh every minute is opt-in (a checkbox,
// ?refresh=1). The URL carries the view (source, prediction filters, sort, search, page, selected card).
import { api, download } from "../api.js";
import { h, replace } from "../dom.js";
import { fmtNumber, fmtPercent, fmtTime } from "../format.js";
import { LANGUAGES, t } from "../i18n.js";
import { recogniseTypes } from "../logic/labels.js";
import { DEFAULT_RANGE, RANGES } from "../logic/axis.js";
import { SORTS, STATUSES, TYPES, parseView, predictionParams, writeView } from "../logic/query.js";
import { statsCardState } from "../logic/stats.js";
import { eccChart } from "./ecc_chart.js";
import { activatable, allNodes, blockStatus, idle, loading, table } from "./common.js";

export const PAGE_SIZE = 50;
export const SAMPLE_LIMIT = 20000;
const METRICS = [
  "ecc_corrected_total",
  "ecc_uncorrected_total",
  "retired_pages",
  "remapped_rows_pending",
  "remapped_rows_failure",
  "remapped_rows_uncorrectable",
];
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

export function createGpuHealthPage(main) {
  const view = parseView(location.search);
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
    stalledCaps: idle(), // the matrix's own call with stalled=true, while "stalled only" is on
    refreshTimer: null,
    asOf: null, // when the data on screen was read (the newest answer of the API)
    stats: loading(),
    preds: loading(),
    caps: loading(),
    nodes: loading(),
    samples: idle(),
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
    if (state.stalledOnly) fetchStalled();
    Promise.all([api("/api/v1/gpu-health/capabilities", { params: { source } }), allNodes()]).then(
      apply(([caps, nodes]) => {
        state.nodes = { status: "ok", data: new Map(nodes.map((n) => [n.id, n])) };
        state.caps = { status: "ok", data: caps };
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

  function fetchStalled() {
    const gen = state.gen;
    state.stalledCaps = loading();
    api("/api/v1/gpu-health/capabilities", { params: { source: state.source, stalled: "true" } }).then(
      (data) => gen === state.gen && setBlock("stalledCaps", { status: "ok", data }),
      (error) => gen === state.gen && setBlock("stalledCaps", { status: "error", error }),
    );
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
    state.selected = null;
    state.cardInUrl = false;
    state.stats = loading();
    state.preds = loading();
    state.caps = loading();
    state.nodes = loading();
    state.samples = idle();
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
      return `${t("stats.reason.api")} ${cs.apiReasons.join("; ")}`;
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
      cs.sufficient && cs.apiReasons.length
        ? h("p", { class: "muted small" }, `${t("stats.notes")}: ${cs.apiReasons.join("; ")}`)
        : null,
    );
  }

  function choice(id, values, currentValue, labelKey, onPick) {
    return h(
      "div",
      { class: "control" },
      h("label", { for: id }, t(labelKey)),
      h(
        "select",
        { id, onchange: (event) => onPick(event.target.value) },
        values.map((v) => h("option", { value: v.value, selected: v.value === currentValue }, v.label)),
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
    const search = h(
      "form",
      {
        class: "control search",
        role: "search",
        onsubmit: (event) => {
          event.preventDefault();
          const value = event.target.elements.namedItem("q").value.trim().slice(0, 128);
          refilter(() => {
            state.q = value;
          });
        },
      },
      h("label", { for: "pred-search" }, t("pred.search")),
      h("input", { type: "search", id: "pred-search", name: "q", value: state.q, maxlength: 128, placeholder: t("pred.search_hint") }),
      h("button", { type: "submit", id: "pred-search-go" }, t("pred.search_go")),
    );
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
        pager(body),
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
      pager(body),
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
        h("pre", {}, p.evidence),
        p.conclusion ? h("p", { class: "conclusion" }, `${t("pred.conclusion")}: ${p.conclusion}`) : null,
      ),
    );
    return activatable(row, () => selectCard({ node_id: p.node_id, gpu_index: p.gpu_index }));
  }

  function pager(body) {
    if (body.total <= PAGE_SIZE) return h("p", { class: "pager", id: "pred-pager" }, t("pred.total", { total: body.total }));
    const pages = Math.ceil(body.total / PAGE_SIZE);
    const page = Math.floor(body.offset / PAGE_SIZE) + 1;
    const go = (delta) => () => {
      state.offset = Math.max(0, state.offset + delta * PAGE_SIZE);
      fetchPredictions();
    };
    return h(
      "nav",
      { class: "pager", id: "pred-pager", "aria-label": t("pred.title") },
      h("button", { type: "button", id: "pred-prev", disabled: page <= 1, onclick: go(-1) }, t("pred.prev")),
      h("span", { id: "pred-page" }, t("pred.page", { page, pages, total: body.total })),
      h("button", { type: "button", id: "pred-next", disabled: page >= pages, onclick: go(1) }, t("pred.next")),
    );
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
    );
  }

  function renderCapabilities() {
    const toggle = h(
      "label",
      { class: "control small" },
      h("input", {
        type: "checkbox",
        id: "caps-stalled",
        checked: state.stalledOnly,
        onchange: (event) => {
          state.stalledOnly = event.target.checked;
          writeUrl();
          if (state.stalledOnly) fetchStalled();
          else renderCapabilities();
        },
      }),
      " ",
      t("caps.stalled_only"),
    );
    const title = h("div", { class: "block-head" }, h("h2", { id: "caps-title" }, t("caps.title"), simBadge()), toggle);
    const status = blockStatus(state.caps) ?? (state.stalledOnly ? blockStatus(state.stalledCaps) : null);
    if (status) return replace(capsBox, title, status);
    const caps = state.stalledOnly && state.stalledCaps.status === "ok" ? state.stalledCaps.data : state.caps.data;
    const groups = new Map();
    // one row per card (node, index, uuid): a swapped card is a row of its own, stalled or not
    const rowKey = (c) => `${cardKey(c.node_id, c.gpu_index)}|${c.uuid ?? ""}`;
    const shown = state.stalledOnly ? new Set(caps.cards.map(rowKey)) : null;
    for (const card of orderedCards()) {
      if (shown && !shown.has(rowKey(card))) continue;
      if (!groups.has(card.node_id)) groups.set(card.node_id, []);
      groups.get(card.node_id).push(card);
    }
    // Nodes of this source without any health sample still count: all their GPUs are unknown (not "stalled":
    // they never reported, so the stalled-only view leaves them out).
    const unsampled = state.stalledOnly
      ? []
      : [...state.nodes.data.values()]
          .filter((node) => node.source === state.source && !groups.has(node.id))
          .sort((a, b) => a.name.localeCompare(b.name));
    for (const node of unsampled) groups.set(node.id, []);
    const rows = [];
    for (const [nodeId, cards] of groups) {
      const node = state.nodes.data.get(nodeId);
      const sampledSlots = new Set(cards.map((c) => c.gpu_index)).size;
      const missing = node && !state.stalledOnly ? Math.max(0, node.gpu_count - sampledSlots) : 0;
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
            h("td", {}, h("span", { class: "card-name" }, nodeName(nodeId))),
            cards.length === 0 ? vendorCell : null,
            h("td", { colspan: METRICS.length + 2 }, t("caps.more_cards", { count: missing })),
          ),
        );
      }
    }
    replace(
      capsBox,
      title,
      rows.length === 0
        ? h("p", { class: "empty", id: "caps-empty" }, t(state.stalledOnly ? "caps.none_stalled" : "caps.empty"))
        : null,
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
      h("p", { class: "footer-note", id: "caps-note", dataset: { code: caps.note_code ?? "" } }, apiText(caps, "note")),
    );
  }

  function capabilityRow(card, vendorCell, caps) {
    return h(
      "tr",
      { dataset: { node: card.node_id, index: card.gpu_index, stalled: card.collection_stalled ? "true" : "false" } },
      h(
        "td",
        {},
        h("span", { class: "card-name" }, `${nodeName(card.node_id)} #${card.gpu_index}`),
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
        h("br"),
        h("code", { class: "uuid" }, card.uuid ?? t("unknown")),
      ),
      vendorCell,
      METRICS.map((m) =>
        card.metrics[m] === "collectable"
          ? h("td", { class: "metric yes", dataset: { metric: m } }, t("caps.collectable"))
          : h("td", { class: "metric unknown", dataset: { metric: m } }, t("unknown")),
      ),
      h("td", {}, card.trend_prediction_possible ? t("caps.trend_yes") : t("caps.trend_no")),
      h(
        "td",
        { class: "nowrap" },
        fmtTime(card.last_sample_at),
        h("br"),
        h("span", { class: "muted small" }, t("caps.samples", { count: fmtNumber(card.sample_count) })),
      ),
    );
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
