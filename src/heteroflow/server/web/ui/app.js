// The shell's entry point: language, sign-in, and mounting the page the URL names.
import { ApiError, api, setToken, token, whenUnauthorized } from "./api.js";
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

function translateShell() {
  for (const el of document.querySelectorAll("[data-i18n]")) el.textContent = t(el.dataset.i18n);
  document.getElementById("nav").setAttribute("aria-label", t("nav.label"));
  document.getElementById("calibration-heading").textContent = t("calibration.heading");
  for (const link of document.querySelectorAll("#nav a")) {
    if (link.getAttribute("href") === location.pathname) link.setAttribute("aria-current", "page");
  }
  document.title = `${t(`nav.${pageName.replace("-", "_")}`)} · ${t("app.title")}`;
}

function renderSignIn() {
  document.getElementById("signout").hidden = true;
  const input = h("input", { id: "token", type: "password", autocomplete: "off", required: true, spellcheck: "false" });
  const message = h("p", { id: "signin-message", class: "error", role: "alert" }, signInMessage ? t(signInMessage.key, signInMessage.params) : "");
  const button = h("button", { type: "submit", id: "signin-submit" }, t("signin.submit"));
  const form = h(
    "form",
    { class: "block signin", id: "signin", "aria-labelledby": "signin-title" },
    h("h1", { id: "signin-title" }, t("signin.title")),
    h("p", {}, t("signin.explain")),
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
      await api("/api/v1/nodes", { params: { limit: 1 }, bearer: value });
      setToken(value);
      signInMessage = null;
      start();
    } catch (err) {
      const status = err instanceof ApiError ? err.status : 0;
      signInMessage =
        status === 401
          ? { key: "signin.rejected" }
          : status === 403
            ? { key: "signin.forbidden" }
            : { key: "signin.unreachable", params: { detail: err.detail ?? String(err) } };
      message.textContent = t(signInMessage.key, signInMessage.params);
      button.disabled = false;
      input.focus();
    }
  });
  replace(main, form);
  input.focus();
}

function start() {
  if (!token()) {
    page?.stop?.();
    page = null;
    renderSignIn();
    return;
  }
  document.getElementById("signout").hidden = false;
  page = PAGES[pageName](main);
  page.start();
}

document.getElementById("lang").value = (initLanguage(), language());
document.getElementById("lang").addEventListener("change", (event) => {
  setLanguage(event.target.value);
  translateShell();
  if (page) page.render();
  else renderSignIn();
});
document.getElementById("signout").addEventListener("click", () => {
  setToken(null);
  signInMessage = null;
  start();
});
whenUnauthorized(() => {
  setToken(null);
  signInMessage = { key: "session.expired" };
  start();
});
translateShell();
start();
