// The GPU health page's state in its URL, so that a view can be linked, bookmarked and reloaded: the data
// source, the prediction filters and sort, the card search, the page and the selected card. Purely
// computational (no DOM, no history): parse a query string into a view, write a view back as a query string.
// Anything the page does not know is ignored (the defaults apply), never an error.

export const STATUSES = Object.freeze(["all", "pending", "hit", "miss", "voided"]);
export const TYPES = Object.freeze([
  "all",
  "strong",
  "trend",
  "uncorrectable_ecc",
  "remap_failure",
  "corrected_ecc_growth",
  "pending_remap_growth",
  "retired_pages_growth",
]);
export const SORTS = Object.freeze(["newest", "strong_first", "window_end"]);
export const CAPS_SORTS = Object.freeze(["node", "stalled_first", "recent_first"]);
/** The capability matrix's "unknown" filter: any counter, or one of them (the API's ``unknown``). */
export const CAPS_UNKNOWNS = Object.freeze([
  "any",
  "ecc_corrected_total",
  "ecc_uncorrected_total",
  "retired_pages",
  "remapped_rows_pending",
  "remapped_rows_failure",
  "remapped_rows_uncorrectable",
]);
export const DEFAULT_VIEW = Object.freeze({
  source: "real",
  status: "all",
  type: "all",
  sort: "newest",
  q: "",
  page: 1,
  card: null,
  refresh: false,
  range: 7,
  stalled: false,
  // the capability matrix's own filters, order and page
  cq: "",
  cnode: "",
  cunknown: "",
  csort: "node",
  cpage: 1,
});
const RANGES = [1, 7, 30];

const MAX_PAGE = 200_000; // offset 10,000,000 at 50 a page: the API's bound

/**
 * @param {string} search location.search
 * @returns {{source: string, status: string, type: string, sort: string, q: string, page: number,
 *            card: {node_id: string, gpu_index: number}|null, refresh: boolean}}
 */
export function parseView(search) {
  const p = new URLSearchParams(search);
  const pick = (name, allowed) => (allowed.includes(p.get(name)) ? p.get(name) : DEFAULT_VIEW[name]);
  // ?node=<name> (the serving dashboard's link from a pod to its node) searches for that node's cards
  const q = (p.get("q") ?? p.get("node") ?? "").trim().slice(0, 128);
  return {
    source: p.get("source") === "simulated" ? "simulated" : "real",
    status: pick("status", STATUSES),
    type: pick("type", TYPES),
    sort: pick("sort", SORTS),
    q,
    page: pageOf(p.get("page")),
    card: parseCard(p.get("card")),
    refresh: p.get("refresh") === "1",
    range: RANGES.includes(Number(p.get("range"))) ? Number(p.get("range")) : DEFAULT_VIEW.range,
    stalled: p.get("stalled") === "1",
    cq: (p.get("cq") ?? "").trim().slice(0, 128),
    cnode: (p.get("cnode") ?? "").trim().slice(0, 64),
    cunknown: CAPS_UNKNOWNS.includes(p.get("cunknown")) ? p.get("cunknown") : "",
    csort: CAPS_SORTS.includes(p.get("csort")) ? p.get("csort") : DEFAULT_VIEW.csort,
    cpage: pageOf(p.get("cpage")),
  };
}

function pageOf(text) {
  const page = Number.parseInt(text ?? "", 10);
  return Number.isInteger(page) && page >= 1 && page <= MAX_PAGE ? page : 1;
}

/**
 * The serving dashboard's link to one card, ``?node=<name>&gpu=<index>``: {node: name, gpu: index}, else null (the
 * page then shows that card once it knows the node's id; the URL then carries it as ``card=``).
 */
export function parseNodeLink(search) {
  const p = new URLSearchParams(search);
  const node = (p.get("node") ?? "").trim();
  const gpu = Number(p.get("gpu") ?? "");
  if (!node || p.get("gpu") === null || !Number.isInteger(gpu) || gpu < 0 || gpu > 4095) return null;
  return { node, gpu };
}

/** "<node id>:<index>" → {node_id, gpu_index}; anything else → null. */
export function parseCard(text) {
  if (typeof text !== "string") return null;
  const at = text.lastIndexOf(":");
  if (at <= 0) return null;
  const index = Number(text.slice(at + 1));
  if (!Number.isInteger(index) || index < 0 || index > 4095) return null;
  return { node_id: text.slice(0, at), gpu_index: index };
}

/** The query string of a view: only what differs from the defaults, in a stable order ("" for the defaults). */
export function writeView(view) {
  const p = new URLSearchParams();
  if (view.source === "simulated") p.set("source", "simulated");
  for (const name of ["status", "type", "sort"]) if (view[name] !== DEFAULT_VIEW[name]) p.set(name, view[name]);
  if (view.q) p.set("q", view.q);
  if (view.page > 1) p.set("page", String(view.page));
  if (view.card) p.set("card", `${view.card.node_id}:${view.card.gpu_index}`);
  if (view.refresh) p.set("refresh", "1");
  if (view.range !== DEFAULT_VIEW.range) p.set("range", String(view.range));
  if (view.stalled) p.set("stalled", "1");
  if (view.cq) p.set("cq", view.cq);
  if (view.cnode) p.set("cnode", view.cnode);
  if (view.cunknown) p.set("cunknown", view.cunknown);
  if (view.csort && view.csort !== DEFAULT_VIEW.csort) p.set("csort", view.csort);
  if (view.cpage > 1) p.set("cpage", String(view.cpage));
  const text = p.toString();
  return text ? `?${text}` : "";
}

/** The prediction list's API parameters for a view (page size ``pageSize``). */
export function predictionParams(view, pageSize) {
  const params = { source: view.source, limit: pageSize, offset: (view.page - 1) * pageSize };
  if (view.status !== "all") params.status = view.status;
  if (view.type !== "all") params.type = view.type;
  if (view.sort !== "newest") params.sort = view.sort;
  if (view.q) params.q = view.q;
  return params;
}

/** The capability matrix's API parameters for a view: its filters, order and page (page size ``pageSize``). */
export function capabilityParams(view, pageSize) {
  const params = { source: view.source, limit: pageSize, offset: ((view.cpage ?? 1) - 1) * pageSize };
  if (view.stalled) params.status = "stalled";
  if (view.cnode) params.node_id = view.cnode;
  if (view.cunknown) params.unknown = view.cunknown;
  if (view.cq) params.q = view.cq;
  if (view.csort && view.csort !== "node") params.sort = view.csort;
  return params;
}

/** The capability matrix's CSV export of a view: its filters and order, every matching card (no page). */
export function capabilityExportHref(view) {
  const { limit, offset, ...params } = capabilityParams(view, 1);
  return `/api/v1/gpu-health/capabilities.csv?${new URLSearchParams(params).toString()}`;
}
