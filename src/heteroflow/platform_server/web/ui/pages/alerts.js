// /alerts: open and resolved alerts, one alert's audit trail, and a manual resolve with a reason. The URL carries
// the filter and the selected alert (?filter=resolved&alert=<id>), so an alert can be linked and reloaded.
import { ApiError, api } from "../api.js";
import { h, replace } from "../dom.js";
import { fmtTime } from "../format.js";
import { t } from "../i18n.js";
import { runbookOf } from "../logic/runbooks.js";
import { activatable, apiCoded, blockStatus, errorText, idle, loading, table } from "./common.js";

const LIMIT = 500;
const SEVERITIES = ["WARN"];

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
const FILTERS = ["open", "resolved", "all"];

/** ``?filter=`` and ``?alert=`` of the URL; anything unknown is the default (open alerts, none selected). */
export function parseAlertsView(search) {
  const p = new URLSearchParams(search);
  const alert = (p.get("alert") ?? "").trim();
  return {
    filter: FILTERS.includes(p.get("filter")) ? p.get("filter") : "open",
    alert: alert && alert.length <= 128 ? alert : null,
  };
}

/** The query string of an alerts view: only what differs from the defaults. */
export function writeAlertsView(view) {
  const p = new URLSearchParams();
  if (view.filter !== "open") p.set("filter", view.filter);
  if (view.alert) p.set("alert", view.alert);
  const text = p.toString();
  return text ? `?${text}` : "";
}

export function createAlertsPage(main) {
  const view = parseAlertsView(location.search);
  const state = {
    filter: view.filter,
    list: loading(),
    detail: idle(),
    selectedId: null,
    gen: 0,
    detailGen: 0,
    message: null,
    drafts: new Map(), // alert id -> the reason typed so far: never lost to a refused or failed resolve
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
    const query = writeAlertsView({ filter: state.filter, alert: state.selectedId });
    history.replaceState(null, "", `${location.pathname}${query}${location.hash}`);
  }

  function fetchList() {
    const gen = ++state.gen;
    writeUrl();
    state.list = loading();
    render();
    const params = { limit: LIMIT };
    if (state.filter !== "all") params.status = state.filter;
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
    try {
      await api(`/api/v1/alerts/${encodeURIComponent(id)}/resolve`, { body: { reason } });
      state.message = { key: "alerts.resolved_ok", kind: "ok" };
      state.drafts.delete(id);
    } catch (err) {
      const status = err instanceof ApiError ? err.status : 0;
      if (status === 403) state.cannotResolve = true;
      state.message =
        status === 403
          ? { key: "alerts.resolve_forbidden", kind: "error" }
          : status === 409
            ? { key: "alerts.resolve_conflict", kind: "error" }
            : { text: errorText(err), kind: "error" };
    }
    fetchList();
    fetchDetail(id);
  }

  function renderList() {
    const select = h(
      "select",
      {
        id: "alert-filter",
        onchange: (event) => {
          state.filter = event.target.value;
          fetchList();
        },
      },
      FILTERS.map((f) => h("option", { value: f, selected: f === state.filter }, t(`alerts.filter.${f}`))),
    );
    const head = h(
      "div",
      { class: "block-head" },
      h("h1", { id: "alerts-title" }, t("alerts.title")),
      h("div", { class: "control" }, h("label", { for: "alert-filter" }, t("alerts.filter")), select),
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
          h("td", { dataset: { severity: a.severity } }, SEVERITIES.includes(a.severity) ? t(`alerts.severity.${a.severity}`) : a.severity),
          h("td", {}, a.node_name),
          h(
            "td",
            {},
            h("span", { class: `badge alert-${a.status}` }, t(`alerts.status.${a.status}`)),
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
          h("td", { class: "nowrap" }, ["raised", "resolved", "backlog"].includes(e.action) ? t(`alerts.action.${e.action}`) : e.action),
          h("td", { dataset: { code: e.note_code?.code ?? "" } }, apiCoded(e.note_code, e.note, e.note_evidence)),
        ),
      ),
      { id: "alert-history" },
    );
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
        alert.node_name,
        " · ",
        h("span", { class: `badge alert-${alert.status}` }, t(`alerts.status.${alert.status}`)),
      ),
      h("p", { class: "message", dataset: { code: alert.message_code?.code ?? "" } }, alertMessage(alert)),
      message,
      runbookSection(alert.type),
      h("h3", {}, t("alerts.history")),
      trail,
      form,
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
