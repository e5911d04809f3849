// The shell's entry point: language, sign-in, and mounting the page the URL names.
// Sign-in exchanges the pasted token for the browser session's HttpOnly cookie (POST /api/v1/auth/session): the
// token is sent once and kept nowhere in the page, and every tab of this browser shares the session.
import { ApiError, SESSION_PATH, api, setSession, whenUnauthorized } from "./api.js";
import { h, replace } from "./dom.js";
import { initLanguage, language, setLanguage, t } from "./i18n.js";
import { createAlertsPage } from "./pages/alerts.js";
import { createGpuHealthPage } from "./pages/gpu_health.js";
import { createNodesPage } from "./pages/nodes.js";
import { createServingPage } from "./pages/serving.js";

const PAGES = {
  "gpu-health": createGpuHealthPage,
  nodes: createNodesPage,
  alerts: createAlertsPage,
  serving: createServingPage,
};
const main = document.getElementById("main");
const pageName = document.body.dataset.page in PAGES ? document.body.dataset.page : "gpu-health";
let page = null;
let signInMessage = null; // {key, params}: re-translated when the language changes
let signOutError = null; // {detail}: why the last sign-out failed (the session is still on)
const CREATE_TOKEN = "heteroflow admin create-token --scopes nodes:read --name <your-name>";

function translateShell() {
  for (const el of document.querySelectorAll("[data-i18n]")) el.textContent = t(el.dataset.i18n);
  document.getElementById("nav").setAttribute("aria-label", t("nav.label"));
  document.getElementById("calibration-heading").textContent = t("calibration.heading");
  // before sign-in (or on a page without the API's disclaimer) the notice is the local text, in this language
  const calibration = document.getElementById("calibration-text");
  if (calibration.dataset.origin !== "api") calibration.textContent = t("calibration.fallback");
  for (const link of document.querySelectorAll("#nav a")) {
    if (link.getAttribute("href") === location.pathname) link.setAttribute("aria-current", "page");
  }
  document.title = `${t(`nav.${pageName.replace("-", "_")}`)} · ${t("app.title")}`;
}

/** Text with its scope names and options (serving:read, --tenant) as unbreakable code. */
function terms(text) {
  return text.split(/(--[a-z]+|\b[a-z]+:[a-z]+\b)/).map((part, i) => (i % 2 ? h("code", { class: "term" }, part) : part));
}

/** A command line that wraps between its words only, never at a hyphen of --scopes. */
function words(command) {
  return command.split(" ").flatMap((word, i) => [i ? " " : "", h("span", { class: "term" }, word)]);
}

function renderSignOutError() {
  const el = document.getElementById("signout-message");
  el.hidden = signOutError === null;
  el.textContent = signOutError ? t("signout.failed", signOutError) : "";
}

function renderSignIn() {
  document.getElementById("signout").hidden = true;
  signOutError = null;
  renderSignOutError();
  const input = h("input", { id: "token", type: "password", autocomplete: "off", required: true, spellcheck: "false" });
  const message = h("p", { id: "signin-message", class: "error", role: "alert" }, signInMessage ? t(signInMessage.key, signInMessage.params) : "");
  const button = h("button", { type: "submit", id: "signin-submit" }, t("signin.submit"));
  const form = h(
    "form",
    { class: "block signin", id: "signin", "aria-labelledby": "signin-title" },
    h("h1", { id: "signin-title" }, t("signin.title")),
    h("p", {}, t("signin.explain")),
    h("p", { id: "signin-where" }, t("signin.where"), h("code", { class: "command" }, words(CREATE_TOKEN))),
    h("p", {}, terms(t("signin.where_scopes"))),
    h("label", { for: "token" }, t("signin.token")),
    h("div", { class: "row" }, input, button),
    message,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const value = input.value.trim();
    if (!value) {
      message.textContent = t("signin.empty");
      return;
    }
    message.textContent = t("signin.checking");
    button.disabled = true;
    try {
      const info = await api(SESSION_PATH, { method: "POST", bearer: value });
      input.value = "";
      setSession(info);
      signInMessage = null;
      showPage();
    } catch (err) {
      const status = err instanceof ApiError ? err.status : 0;
      signInMessage =
        status === 401
          ? { key: "signin.rejected" }
          : { key: "signin.unreachable", params: { detail: err.detail ?? String(err) } };
      message.textContent = t(signInMessage.key, signInMessage.params);
      button.disabled = false;
      input.focus();
    }
  });
  replace(main, form);
  input.focus();
}

function signedOut(message) {
  setSession(null);
  page?.stop?.();
  page = null;
  signInMessage = message;
  renderSignIn();
}

function showPage() {
  document.getElementById("signout").hidden = false;
  page = PAGES[pageName](main);
  page.start();
}

/** Whether this browser holds a session (another tab may have signed in): the page if so, else the form. */
async function start() {
  replace(main, h("p", { class: "muted", id: "session-checking" }, t("session.checking")));
  try {
    setSession(await api(SESSION_PATH, { quiet: true }));
  } catch (err) {
    const status = err instanceof ApiError ? err.status : 0;
    signedOut(status === 401 ? null : { key: "signin.unreachable", params: { detail: err.detail ?? String(err) } });
    return;
  }
  showPage();
}

document.getElementById("lang").value = (initLanguage(), language());
document.getElementById("lang").addEventListener("change", (event) => {
  setLanguage(event.target.value);
  translateShell();
  renderSignOutError();
  if (page) page.render();
  else if (main.querySelector("#signin")) renderSignIn();
});
document.getElementById("signout").addEventListener("click", async () => {
  try {
    await api(SESSION_PATH, { method: "DELETE", quiet: true });
  } catch (err) {
    if (!(err instanceof ApiError && err.status === 401)) {
      // the session is still on (the server could not end it): say so, stay signed in
      signOutError = { detail: err.detail ?? String(err) };
      renderSignOutError();
      return;
    }
  }
  signedOut(null);
});
whenUnauthorized(() => signedOut({ key: "session.expired" }));
translateShell();
start();
