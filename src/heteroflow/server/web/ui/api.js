// Every data call: same origin, the bearer token from sessionStorage, JSON in and out.

const TOKEN_KEY = "heteroflow.token";

export class ApiError extends Error {
  constructor(status, detail) {
    super(detail);
    this.status = status;
    this.detail = detail;
  }
}

export function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function setToken(value) {
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  else sessionStorage.removeItem(TOKEN_KEY);
}

let onUnauthorized = () => {};

export function whenUnauthorized(callback) {
  onUnauthorized = callback;
}

/**
 * GET (or POST with `body`) an API path; resolves to the parsed JSON, rejects with ApiError.
 * @param {string} path e.g. "/api/v1/nodes"
 * @param {{params?: object, body?: object, bearer?: string}} [opts]
 */
export async function api(path, { params = {}, body, bearer } = {}) {
  const query = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== null && v !== undefined && v !== "") query.set(k, String(v));
  const search = query.toString();
  const url = search ? `${path}?${search}` : path;
  const headers = { Accept: "application/json", Authorization: `Bearer ${bearer ?? token() ?? ""}` };
  const init = { method: body === undefined ? "GET" : "POST", headers, cache: "no-store" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(url, init);
  } catch (err) {
    throw new ApiError(0, String(err && err.message ? err.message : err));
  }
  let payload = null;
  try {
    payload = await response.json();
  } catch {
    payload = null;
  }
  if (!response.ok) {
    const detail = payload && typeof payload.detail === "string" ? payload.detail : `HTTP ${response.status}`;
    const error = new ApiError(response.status, detail);
    if (response.status === 401 && bearer === undefined) onUnauthorized(error);
    throw error;
  }
  return payload;
}

/**
 * GET a file (a CSV export) with the bearer token and save it through a Blob link; rejects with ApiError.
 * @param {string} path
 * @param {{params?: object, filename: string}} opts
 */
export async function download(path, { params = {}, filename }) {
  const query = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== null && v !== undefined && v !== "") query.set(k, String(v));
  const search = query.toString();
  let response;
  try {
    response = await fetch(search ? `${path}?${search}` : path, {
      headers: { Authorization: `Bearer ${token() ?? ""}` },
      cache: "no-store",
    });
  } catch (err) {
    throw new ApiError(0, String(err && err.message ? err.message : err));
  }
  if (!response.ok) {
    let detail = `HTTP ${response.status}`;
    try {
      const payload = await response.json();
      if (payload && typeof payload.detail === "string") detail = payload.detail;
    } catch {
      // not JSON: the status says enough
    }
    const error = new ApiError(response.status, detail);
    if (response.status === 401) onUnauthorized(error);
    throw error;
  }
  const url = URL.createObjectURL(await response.blob());
  const link = document.createElement("a");
  link.href = url;
  link.download = filename;
  link.hidden = true;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
}
