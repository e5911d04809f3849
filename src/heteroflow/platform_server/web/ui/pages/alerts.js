// /alerts: alerts an on-call works from. The filters (state, severity, type, node, card) and the selected alert are
// in the URL (?filter=acknowledged&severity=CRITICAL&node=gpu-a&gpu=3&alert=<id>), so a view can be linked and
// reloaded. A GPU_FAULT_PREDICTED alert lists every predicted card of its node, each linked to its history with
// its source; acknowledging (who, when, note) is apart from resolving (who, when, why).
import { ApiError, api } from "../api.js";
import { h, replace } from "../dom.js";
import { fmtTime } from "../format.js";
import { t } from "../i18n.js";
import { evidenceText } from "../logic/api_text.js";
import { DEFAULT_VIEW, writeView } from "../logic/query.js";
import { runbookOf } from "../logic/runbooks.js";
import { activatable, apiCoded, apiTr, blockStatus, errorText, idle, loading, table } from "./common.js";

const LIMIT = 500;
const SEVERITIES = ["CRITICAL", "WARN"];
const TYPES = ["GPU_FAULT_PREDICTED", "GPU_MEMORY_HIGH"];
const ACTIONS = ["raised", "resolved", "backlog", "acknowledged", "card_added", "card_predicted_again"];

/** The short form of the alert type's runbook in the page's language, with its page; null for a type without one. */
function runbookSection(type) {
  const runbook = runbookOf(type);
  if (runbook === null) return null;
  return h(
    "section",
    { class: "runbook", id: "alert-runbook", dataset: { type } },
    h("h3", {}, t("alerts.runbook")),
    h("ol", {}, ...runbook.keys.map((key) => h("li", {}, t(key)))),
    h("p", { class: "muted small" }, t("alerts.runbook.source", { path: runbook.path })),
  );
}

/** An alert's message in the page's language (by its code), the English text when it has none. */
function alertMessage(alert) {
  return apiCoded(alert.message_code, alert.message, alert.message_evidence);
}
const FILTERS = ["open", "unacknowledged", "acknowledged", "resolved", "all"];

/** The URL's filters and selected alert; anything unknown is the default (open alerts, none selected). The older
 * ``?state=`` is read as ``?filter=``. */
export function parseAlertsView(search) {
  const p = new URLSearchParams(search);
  const alert = (p.get("alert") ?? "").trim();
  const state = p.get("state") ?? p.get("filter");
  const gpu = Number(p.get("gpu") ?? "");
  return {
    filter: FILTERS.includes(state) ? state : "open",
    severity: SEVERITIES.includes(p.get("severity")) ? p.get("severity") : "all",
    type: TYPES.includes(p.get("type")) ? p.get("type") : "all",
    node: (p.get("node") ?? "").trim().slice(0, 253),
    gpu: p.get("gpu") !== null && p.get("gpu") !== "" && Number.isInteger(gpu) && gpu >= 0 && gpu <= 4095 ? gpu : null,
    alert: alert && alert.length <= 128 ? alert : null,
  };
}

/** The query string of an alerts view: only what differs from the defaults. */
export function writeAlertsView(view) {
  const p = new URLSearchParams();
  if (view.filter && view.filter !== "open") p.set("filter", view.filter);
  if (view.severity && view.severity !== "all") p.set("severity", view.severity);
  if (view.type && view.type !== "all") p.set("type", view.type);
  if (view.node) p.set("node", view.node);
  if (view.gpu !== null && view.gpu !== undefined) p.set("gpu", String(view.gpu));
  if (view.alert) p.set("alert", view.alert);
  const text = p.toString();
  return text ? `?${text}` : "";
}

/** The API parameters of an alerts view. */
export function alertParams(view, limit) {
  const params = { limit };
  if (view.filter === "open" || view.filter === "resolved") params.status = view.filter;
  if (view.filter === "acknowledged" || view.filter === "unacknowledged") {
    params.status = "open";
    params.acknowledged = view.filter === "acknowledged" ? "true" : "false";
  }
  if (view.severity && view.severity !== "all") params.severity = view.severity;
  if (view.type && view.type !== "all") params.type = view.type;
  if (view.node) params.node = view.node;
  if (view.gpu !== null && view.gpu !== undefined) params.gpu = view.gpu;
  return params;
}

/** The GPU health page of one card of an alert, on the card's own source. */
export function cardHref(alert, card) {
  return `/nodes/gpu-health${writeView({
    ...DEFAULT_VIEW,
    source: card.source === "simulated" ? "simulated" : "real",
    card: { node_id: alert.node_id, gpu_index: card.gpu_index },
  })}`;
}

function signalText(code) {
  return apiTr.has(`type.${code}`) ? t(`type.${code}`) : code;
}

function severityText(severity) {
  return SEVERITIES.includes(severity) ? t(`alerts.severity.${severity}`) : severity;
}

function severityBadge(severity) {
  return h("span", { class: `badge severity-${String(severity).toLowerCase()}`, dataset: { severity } }, severityText(severity));
}

/** The alert's cards as links, each with its severity and signals. */
function cardLinks(alert) {
  if (!alert.cards || alert.cards.length === 0) return alert.type === "GPU_FAULT_PREDICTED" ? t("none") : null;
  return h(
    "ul",
    { class: "alert-cards" },
    alert.cards.map((c) =>
      h(
        "li",
        { dataset: { gpu: c.gpu_index, severity: c.severity } },
        h(
          "a",
          {
            href: cardHref(alert, c),
            class: "card-link",
            // the link, not the row: a click or Enter on it opens the card, not the alert's detail
            onclick: (event) => event.stopPropagation(),
            onkeydown: (event) => event.stopPropagation(),
          },
          t("alerts.card", { index: c.gpu_index }),
        ),
        " ",
        severityBadge(c.severity),
        " ",
        h("span", { class: "muted small" }, c.signals.map(signalText).join(", ")),
      ),
    ),
  );
}

export function createAlertsPage(main) {
  const view = parseAlertsView(location.search);
  const state = {
    filter: view.filter,
    severity: view.severity,
    type: view.type,
    node: view.node,
    gpu: view.gpu,
    list: loading(),
    detail: idle(),
    selectedId: null,
    gen: 0,
    detailGen: 0,
    message: null,
    drafts: new Map(), // alert id -> the reason typed so far: never lost to a refused or failed resolve
    notes: new Map(), // alert id -> the acknowledgement note typed so far
    // the token's scopes (GET /api/v1/auth/whoami) say whether it may resolve; a 403 says so too. Until whoami
    // answers, the form is offered (the server decides; a refused reason is kept).
    cannotResolve: false,
  };
  const listBox = h("section", { class: "block", "aria-labelledby": "alerts-title" });
  const detailBox = h("section", {
    class: "block",
    id: "alert-detail",
    tabindex: "-1",
    "aria-labelledby": "alert-detail-title",
  });

  function writeUrl() {
    const query = writeAlertsView({ ...state, alert: state.selectedId });
    history.replaceState(null, "", `${location.pathname}${query}${location.hash}`);
  }

  function fetchList() {
    const gen = ++state.gen;
    writeUrl();
    state.list = loading();
    render();
    const params = alertParams(state, LIMIT);
    api("/api/v1/alerts", { params }).then(
      (data) => gen === state.gen && ((state.list = { status: "ok", data }), render()),
      (error) => gen === state.gen && ((state.list = { status: "error", error }), render()),
    );
  }

  function fetchDetail(id) {
    state.selectedId = id;
    writeUrl();
    const gen = ++state.detailGen;
    state.detail = loading();
    render();
    api(`/api/v1/alerts/${encodeURIComponent(id)}`).then(
      (data) => gen === state.detailGen && ((state.detail = { status: "ok", data }), render()),
      (error) => gen === state.detailGen && ((state.detail = { status: "error", error }), render()),
    );
  }

  async function resolve(id, reason) {
    if (!reason || reason.length > 2000) {
      state.message = { key: "alerts.resolve_empty", kind: "error" };
      return render();
    }
    await write(id, "resolve", { reason }, { ok: "alerts.resolved_ok", conflict: "alerts.resolve_conflict" }, state.drafts);
  }

  async function acknowledge(id, note) {
    if (note.length > 2000) {
      state.message = { key: "alerts.ack_too_long", kind: "error" };
      return render();
    }
    await write(id, "acknowledge", { note }, { ok: "alerts.acknowledged_ok", conflict: "alerts.ack_conflict" }, state.notes);
  }

  // One write on an alert (resolve, acknowledge): its message, the draft it consumed, then the list and detail again.
  async function write(id, action, body, keys, drafts) {
    try {
      await api(`/api/v1/alerts/${encodeURIComponent(id)}/${action}`, { body });
      state.message = { key: keys.ok, kind: "ok" };
      drafts.delete(id);
    } catch (err) {
      const status = err instanceof ApiError ? err.status : 0;
      if (status === 403) state.cannotResolve = true;
      state.message =
        status === 403
          ? { key: "alerts.resolve_forbidden", kind: "error" }
          : status === 409
            ? { key: keys.conflict, kind: "error" }
            : { text: errorText(err), kind: "error" };
    }
    fetchList();
    fetchDetail(id);
  }

  function filterBar() {
    const choose = (id, name, values, label) =>
      h(
        "div",
        { class: "control" },
        h("label", { for: id }, t(label)),
        h(
          "select",
          {
            id,
            onchange: (event) => {
              state[name] = event.target.value;
              fetchList();
            },
          },
          values.map(([value, text]) => h("option", { value, selected: value === state[name] }, text)),
        ),
      );
    const nodeInput = h("input", {
      id: "alert-node",
      type: "search",
      maxlength: 253,
      value: state.node,
      placeholder: t("alerts.node_placeholder"),
      onchange: (event) => {
        state.node = event.target.value.trim();
        fetchList();
      },
    });
    const gpuInput = h("input", {
      id: "alert-gpu",
      type: "number",
      min: 0,
      max: 4095,
      step: 1,
      inputmode: "numeric",
      value: state.gpu ?? "",
      onchange: (event) => {
        const value = Number(event.target.value);
        state.gpu = event.target.value !== "" && Number.isInteger(value) && value >= 0 && value <= 4095 ? value : null;
        fetchList();
      },
    });
    return h(
      "div",
      { class: "controls alert-filters", role: "search", "aria-label": t("alerts.filters") },
      choose("alert-filter", "filter", FILTERS.map((f) => [f, t(`alerts.filter.${f}`)]), "alerts.filter"),
      choose(
        "alert-severity",
        "severity",
        [["all", t("alerts.filter.all")], ...SEVERITIES.map((v) => [v, severityText(v)])],
        "alerts.col.severity",
      ),
      choose("alert-type", "type", [["all", t("alerts.filter.all")], ...TYPES.map((v) => [v, v])], "alerts.col.type"),
      h("div", { class: "control" }, h("label", { for: "alert-node" }, t("alerts.col.node")), nodeInput),
      h("div", { class: "control" }, h("label", { for: "alert-gpu" }, t("alerts.gpu_filter")), gpuInput),
    );
  }

  function renderList() {
    const head = h(
      "div",
      { class: "block-head" },
      h("h1", { id: "alerts-title" }, t("alerts.title")),
      filterBar(),
    );
    const status = blockStatus(state.list);
    if (status) return replace(listBox, head, status);
    const body = state.list.data;
    const rows = body.items.map((a) =>
      activatable(
        h(
          "tr",
          { dataset: { id: a.id, status: a.status }, class: a.id === state.selectedId ? "selected" : null },
          h("td", {}, h("code", {}, a.type)),
          h("td", { dataset: { severity: a.severity } }, severityBadge(a.severity)),
          h("td", {}, a.node_name),
          h("td", { class: "cards" }, cardLinks(a)),
          h(
            "td",
            {},
            h("span", { class: `badge alert-${a.status}` }, t(`alerts.status.${a.status}`)),
            a.status === "open" && a.acknowledged_at
              ? h(
                  "span",
                  { class: "badge acknowledged", title: t("alerts.acknowledged_by", { by: a.acknowledged_by ?? t("unknown"), at: fmtTime(a.acknowledged_at) }) },
                  t("alerts.acknowledged"),
                )
              : null,
            a.backlog ? h("span", { class: "badge backlog", title: t("alerts.backlog_title") }, t("alerts.backlog")) : null,
          ),
          h("td", { class: "message", dataset: { code: a.message_code?.code ?? "" } }, alertMessage(a)),
          h("td", { class: "nowrap" }, fmtTime(a.created_at)),
          h(
            "td",
            {},
            a.status === "resolved"
              ? t("alerts.resolved_by", { by: a.resolved_by ?? t("unknown"), at: fmtTime(a.resolved_at), reason: apiCoded(a.resolution_code, a.resolution ?? "") })
              : t("none"),
          ),
        ),
        () => {
          state.message = null;
          fetchDetail(a.id);
          detailBox.focus({ preventScroll: true });
          detailBox.scrollIntoView({ block: "nearest" });
        },
      ),
    );
    replace(
      listBox,
      head,
      rows.length ? h("p", { class: "muted small" }, t("alerts.select_hint")) : null,
      rows.length === 0
        ? h("p", { class: "empty" }, t("alerts.empty"))
        : table(
            t("alerts.title"),
            [
              t("alerts.col.type"),
              t("alerts.col.severity"),
              t("alerts.col.node"),
              t("alerts.col.cards"),
              t("alerts.col.status"),
              t("alerts.col.message"),
              t("alerts.col.created"),
              t("alerts.col.resolved"),
            ],
            rows,
            { id: "alerts-table" },
          ),
      h("p", { class: "pager", id: "alerts-total" }, t("alerts.total", { shown: body.items.length, total: body.total })),
    );
  }

  function renderDetail() {
    if (state.detail.status === "idle") {
      detailBox.hidden = true;
      return replace(detailBox);
    }
    detailBox.hidden = false;
    const title = h("h2", { id: "alert-detail-title" }, t("alerts.detail"));
    const message = state.message
      ? h(
          "p",
          { class: state.message.kind === "ok" ? "ok" : "error", role: "status", id: "resolve-message" },
          state.message.key ? t(state.message.key) : state.message.text,
        )
      : null;
    const status = blockStatus(state.detail);
    if (status) return replace(detailBox, title, message, status);
    const { alert, history } = state.detail.data;
    const trail = table(
      t("alerts.history"),
      [t("alerts.history.at"), t("alerts.history.actor"), t("alerts.history.action"), t("alerts.history.note")],
      history.map((e) =>
        h(
          "tr",
          { dataset: { action: e.action } },
          h("td", { class: "nowrap" }, fmtTime(e.at)),
          h("td", {}, e.actor === "system" ? t("alerts.actor.system") : h("code", {}, e.actor)),
          h("td", { class: "nowrap" }, ACTIONS.includes(e.action) ? t(`alerts.action.${e.action}`) : e.action),
          h("td", { dataset: { code: e.note_code?.code ?? "" } }, apiCoded(e.note_code, e.note, e.note_evidence)),
        ),
      ),
      { id: "alert-history" },
    );
    let ackForm = null;
    if (alert.status === "open") {
      const note = h("textarea", {
        id: "ack-note",
        rows: 2,
        maxlength: 2000,
        readonly: state.cannotResolve,
        oninput: (event) => state.notes.set(alert.id, event.target.value),
      });
      note.value = state.notes.get(alert.id) ?? "";
      ackForm = h(
        "form",
        { id: "ack-form", class: "resolve" },
        h("label", { for: "ack-note" }, t("alerts.ack_note")),
        note,
        state.cannotResolve ? null : h("button", { type: "submit", id: "ack-submit" }, t("alerts.acknowledge")),
      );
      ackForm.addEventListener("submit", (event) => {
        event.preventDefault();
        if (!state.cannotResolve) acknowledge(alert.id, note.value.trim());
      });
    }
    const cards =
      alert.cards && alert.cards.length
        ? table(
            t("alerts.cards"),
            [t("alerts.col.card"), t("alerts.col.severity"), t("alerts.col.signals"), t("alerts.col.prediction"), t("alerts.col.evidence")],
            alert.cards.map((c) =>
              h(
                "tr",
                { dataset: { gpu: c.gpu_index, severity: c.severity } },
                h(
                  "td",
                  { class: "nowrap" },
                  h("a", { href: cardHref(alert, c), class: "card-link" }, t("alerts.card", { index: c.gpu_index })),
                  c.uuid ? h("div", { class: "muted small" }, h("code", {}, c.uuid)) : null,
                ),
                h("td", {}, severityBadge(c.severity)),
                h("td", {}, c.signals.map(signalText).join(", ")),
                h("td", { class: "nowrap" }, apiTr.has(`status.${c.status}`) ? t(`status.${c.status}`) : c.status, h("div", { class: "muted small" }, fmtTime(c.t0))),
                h(
                  "td",
                  { class: "evidence" },
                  c.evidence.map((line) => h("div", {}, evidenceText(line, apiTr))),
                ),
              ),
            ),
            { id: "alert-cards" },
          )
        : null;
    let form = null;
    if (alert.status === "open") {
      const reason = h("textarea", {
        id: "resolve-reason",
        rows: 3,
        maxlength: 2000,
        "aria-required": "true",
        readonly: state.cannotResolve,
        oninput: (event) => state.drafts.set(alert.id, event.target.value),
      });
      reason.value = state.drafts.get(alert.id) ?? "";
      form = h(
        "form",
        { id: "resolve-form", class: "resolve" },
        h("label", { for: "resolve-reason" }, t("alerts.reason")),
        reason,
        state.cannotResolve
          ? h("p", { class: "muted small", id: "resolve-unavailable" }, t("alerts.resolve_unavailable"))
          : h("button", { type: "submit", id: "resolve-submit" }, t("alerts.resolve")),
      );
      form.addEventListener("submit", (event) => {
        event.preventDefault();
        if (!state.cannotResolve) resolve(alert.id, reason.value.trim());
      });
    }
    replace(
      detailBox,
      title,
      h(
        "p",
        {},
        h("code", {}, alert.type),
        " · ",
        severityBadge(alert.severity),
        " · ",
        alert.node_name,
        " · ",
        h("span", { class: `badge alert-${alert.status}` }, t(`alerts.status.${alert.status}`)),
      ),
      h("p", { class: "message", dataset: { code: alert.message_code?.code ?? "" } }, alertMessage(alert)),
      alert.acknowledged_at
        ? h(
            "p",
            { id: "ack-status" },
            t("alerts.acknowledged_by", { by: alert.acknowledged_by ?? t("unknown"), at: fmtTime(alert.acknowledged_at) }),
            alert.acknowledgement ? `: ${alert.acknowledgement}` : "",
          )
        : null,
      message,
      cards ? h("h3", {}, t("alerts.cards")) : null,
      cards,
      runbookSection(alert.type),
      h("h3", {}, t("alerts.history")),
      trail,
      form,
      ackForm ? h("h3", {}, t("alerts.acknowledge")) : null,
      ackForm,
      h(
        "button",
        {
          type: "button",
          id: "detail-close",
          onclick: () => {
            state.detail = idle();
            state.selectedId = null;
            state.message = null;
            writeUrl();
            render();
          },
        },
        t("alerts.close"),
      ),
    );
  }

  function render() {
    renderList();
    renderDetail();
  }

  return {
    start() {
      replace(main, listBox, detailBox);
      api("/api/v1/auth/whoami").then(
        (me) => {
          const scopes = Array.isArray(me?.scopes) ? me.scopes : [];
          if (!scopes.includes("alerts:write") && !scopes.includes("admin")) {
            state.cannotResolve = true;
            render();
          }
        },
        () => {}, // unknown: offered, and the server's answer decides
      );
      fetchList();
      if (view.alert) fetchDetail(view.alert); // a linked alert: shown even when the filter hides its row
    },
    render,
    stop() {
      state.gen += 1;
      state.detailGen += 1;
    },
  };
}
