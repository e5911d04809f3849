// Pieces shared by the pages: block states, node names, table helpers.
import { api } from "../api.js";
import { h } from "../dom.js";
import { fmtTime } from "../format.js";
import { LANGUAGES, t } from "../i18n.js";
import { codedText } from "../logic/api_text.js";

/** What logic/api_text.js needs of the dictionary: a key lookup, whether a key exists, the time format. */
export const apiTr = Object.freeze({ t, has: (key) => key in LANGUAGES.en, time: fmtTime });

/** An API text ({code, params, text}) in the page's language; ``fallback`` when the API sent no coded text. */
export function apiCoded(coded, fallback, evidence = []) {
  return coded ? codedText(coded, apiTr, evidence) : fallback;
}

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

/** A labelled select: ``values`` are {value, label}; ``onPick`` gets the chosen value. */
export function choice(id, values, currentValue, labelKey, onPick) {
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

/**
 * A list's pager: "N rows" when one page holds them all, else previous / "Page p of n · N rows" / next. ``prefix``
 * names its ids (``<prefix>-pager``, ``-prev``, ``-page``, ``-next``) and its texts (``<prefix>.total``, ``.page``,
 * ``.prev``, ``.next``, ``.title``); ``onTurn(delta)`` turns the page by ±1.
 */
export function pager(prefix, body, pageSize, onTurn) {
  if (body.total <= pageSize) return h("p", { class: "pager", id: `${prefix}-pager` }, t(`${prefix}.total`, { total: body.total }));
  const pages = Math.ceil(body.total / pageSize);
  const page = Math.floor(body.offset / pageSize) + 1;
  return h(
    "nav",
    { class: "pager", id: `${prefix}-pager`, "aria-label": t(`${prefix}.title`) },
    h("button", { type: "button", id: `${prefix}-prev`, disabled: page <= 1, onclick: () => onTurn(-1) }, t(`${prefix}.prev`)),
    h("span", { id: `${prefix}-page` }, t(`${prefix}.page`, { page, pages, total: body.total })),
    h("button", { type: "button", id: `${prefix}-next`, disabled: page >= pages, onclick: () => onTurn(1) }, t(`${prefix}.next`)),
  );
}

/**
 * A card search form: ``prefix`` names its input (``<prefix>-search``), button (``<prefix>-search-go``) and texts
 * (``<prefix>.search``, ``.search_hint``, ``.search_go``); ``onSearch`` gets the trimmed text (at most 128 chars).
 */
export function searchForm(prefix, value, onSearch) {
  return h(
    "form",
    {
      class: "control search",
      role: "search",
      onsubmit: (event) => {
        event.preventDefault();
        onSearch(event.target.elements.namedItem("q").value.trim().slice(0, 128));
      },
    },
    h("label", { for: `${prefix}-search` }, t(`${prefix}.search`)),
    h("input", { type: "search", id: `${prefix}-search`, name: "q", value, maxlength: 128, placeholder: t(`${prefix}.search_hint`) }),
    h("button", { type: "submit", id: `${prefix}-search-go` }, t(`${prefix}.search_go`)),
  );
}
