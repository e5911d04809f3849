// /nodes: the nodes in the caller's scope with online state and GPU counts.
import { api } from "../api.js";
import { h, replace } from "../dom.js";
import { fmtNumber, fmtTime } from "../format.js";
import { t } from "../i18n.js";
import { blockStatus, loading, table } from "./common.js";

const LIMIT = 1000;

export function createNodesPage(main) {
  const state = { nodes: loading(), gen: 0 };
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
      ),
    );
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
            ],
            rows,
            { id: "nodes-table" },
          ),
      h("p", { class: "pager", id: "nodes-total" }, t("nodes.total", { shown: body.items.length, total: body.total })),
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
