// Every data call: same origin, authenticated by the browser session's cookie (HttpOnly: no script here ever
// sees it, nor the token it was made from), JSON in and out. Writes carry the session's CSRF token, which only
// this page can read (GET /api/v1/auth/session); the browser adds the Origin header the server checks too.

export const SESSION_PATH = "/api/v1/auth/session";
let csrfToken = null;

export class ApiError extends Error {
  constructor(status, detail) {
    super(detail);
    this.status = status;
    this.detail = detail;
  }
}

/** Keep (or forget, with null) the session a sign-in or GET /api/v1/auth/session described. */
export function setSession(info) {
  csrfToken = info && typeof info.csrf_token === "string" ? info.csrf_token : null;
}

let onUnauthorized = () => {};

export function whenUnauthorized(callback) {
  onUnauthorized = callback;
}

/**
 * GET (or POST with `body`, or `method`) an API path; resolves to the parsed JSON (null without a body),
 * rejects with ApiError. With `bearer` (the sign-in form only) the token goes in the Authorization header and a
 * 401 is the caller's to explain; `quiet` leaves a 401 to the caller too.
 * @param {string} path e.g. "/api/v1/nodes"
 * A write refused 403 is retried once when the session's CSRF token has changed (another tab signed in again).
 * @param {{params?: object, body?: object, method?: string, bearer?: string, quiet?: boolean, retried?: boolean}} [opts]
 */
export async function api(path, { params = {}, body, method, bearer, quiet = false, retried = false } = {}) {
  const query = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== null && v !== undefined && v !== "") query.set(k, String(v));
  const search = query.toString();
  const url = search ? `${path}?${search}` : path;
  const verb = method ?? (body === undefined ? "GET" : "POST");
  const headers = { Accept: "application/json" };
  if (bearer !== undefined) headers.Authorization = `Bearer ${bearer}`;
  else if (verb !== "GET" && verb !== "HEAD" && csrfToken) headers["X-CSRF-Token"] = csrfToken;
  const init = { method: verb, headers, cache: "no-store", credentials: "same-origin" };
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
  const sent = headers["X-CSRF-Token"];
  if (response.status === 403 && sent !== undefined && !retried) {
    // another tab signed in again meanwhile (the cookie is a new session): take its CSRF token, retry once
    const info = await api(SESSION_PATH, { quiet: true }).catch(() => null);
    if (info && info.csrf_token !== sent) {
      setSession(info);
      return api(path, { params, body, method, quiet, retried: true });
    }
  }
  if (!response.ok) {
    const detail = payload && typeof payload.detail === "string" ? payload.detail : `HTTP ${response.status}`;
    const error = new ApiError(response.status, detail);
    if (response.status === 401 && bearer === undefined && !quiet) onUnauthorized(error);
    throw error;
  }
  return payload;
}

/**
 * GET a file (a CSV export) with the session cookie and save it through a Blob link; rejects with ApiError.
 * @param {string} path
 * @param {{params?: object, filename: string}} opts
 */
export async function download(path, { params = {}, filename }) {
  const query = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== null && v !== undefined && v !== "") query.set(k, String(v));
  const search = query.toString();
  let response;
  try {
    response = await fetch(search ? `${path}?${search}` : path, { cache: "no-store", credentials: "same-origin" });
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
