// Pieces shared by the pages: block states, node names, table helpers.
import { api } from "../api.js";
import { h } from "../dom.js";
import { t } from "../i18n.js";

export const loading = () => ({ status: "loading", data: null, error: null });
export const idle = () => ({ status: "idle", data: null, error: null });

export function errorText(err) {
  if (err && err.status === 403) return t("error.forbidden");
  return t("error.load", { detail: err && err.detail ? err.detail : String(err) });
}

/** Loading / error paragraphs for a block that is not "ok"; null when it is. */
export function blockStatus(block) {
  if (block.status === "loading") return h("p", { class: "muted", role: "status" }, t("loading"));
  if (block.status === "error") return h("p", { class: "error", role: "alert" }, errorText(block.error));
  return null;
}

/** Every node in the caller's scope (both sources), following the pages of the node list. */
export async function allNodes() {
  const items = [];
  for (let offset = 0, page = 0; page < 50; page += 1) {
    const body = await api("/api/v1/nodes", { params: { limit: 1000, offset } });
    items.push(...body.items);
    offset += body.items.length;
    if (body.items.length === 0 || offset >= body.total) break;
  }
  return items;
}

export function table(caption, headers, rows, attrs = {}) {
  return h(
    "div",
    { class: "table-wrap" },
    h(
      "table",
      attrs,
      caption ? h("caption", { class: "sr-only" }, caption) : null,
      h("thead", {}, h("tr", {}, headers.map((x) => h("th", { scope: "col" }, x)))),
      h("tbody", {}, rows),
    ),
  );
}

/** Make a table row act like a button: click, Enter and Space. */
export function activatable(row, onActivate) {
  row.tabIndex = 0;
  row.classList.add("clickable");
  row.addEventListener("click", onActivate);
  row.addEventListener("keydown", (event) => {
    if (event.key === "Enter" || event.key === " ") {
      event.preventDefault();
      onActivate();
    }
  });
  return row;
}
