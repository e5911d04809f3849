// The serving dashboard's gate block: what the instance's engines can do (the fault-tolerance protocol profile the
// NodeManagers discovered, whether they can scale down and retry) and the gate's verdict, each reason code with
// its meaning, a sentence for the engine's own refusals (ENGINE_SCALE_DOWN_UNSUPPORTED, CAPABILITY_MISMATCH)
// and the gate's warnings verbatim.
import { h } from "../dom.js";
import { t } from "../i18n.js";
import { engineCapability, gateReasons } from "../logic/serving.js";

function supportBadge(value) {
  if (value === null) return h("span", { class: "badge tone-unknown" }, t("unknown"));
  return h(
    "span",
    { class: `badge ${value ? "tone-ok" : "tone-warn"}`, dataset: { supported: String(value) } },
    t(value ? "serving.engine.supported" : "serving.engine.unsupported"),
  );
}

/** The engines' capability as facts (nothing when the controller sent none: an instance not assembled yet). */
function renderEngine(entry) {
  const cap = engineCapability(entry);
  if (cap === null) return null;
  const fact = (name, key, value) => h("div", { class: "fact", dataset: { fact: name } }, h("dt", {}, t(key)), h("dd", {}, value));
  return h(
    "dl",
    { class: "facts engine-capability", dataset: { profile: cap.profile ?? "" } },
    h(
      "div",
      { class: "fact wide", dataset: { fact: "profile" } },
      h("dt", {}, t("serving.engine.profile")),
      h(
        "dd",
        {},
        cap.profile === null ? null : h("code", { class: "profile-name" }, cap.profile),
        cap.profileKey ? h("span", { class: "explain" }, t(cap.profileKey)) : null,
      ),
    ),
    fact("scale_down", "serving.engine.scale_down", supportBadge(cap.scaleDown)),
    fact("retry", "serving.engine.retry", supportBadge(cap.retry)),
  );
}

/** The engines' capability, the verdict, the reasons (with their sentences) and the warnings. */
export function renderGate(entry) {
  const gate = gateReasons(entry);
  const verdict =
    gate.allowed === null
      ? h("span", { class: "badge tone-unknown" }, t("unknown"))
      : h(
          "span",
          { class: `badge ${gate.allowed ? "tone-ok" : "tone-bad"}` },
          gate.allowed ? t("serving.gate.allowed") : t("serving.gate.refused"),
        );
  return [
    renderEngine(entry),
    h("p", { class: "gate", dataset: { allowed: String(gate.allowed) } }, h("strong", {}, t("serving.gate")), " ", verdict),
    gate.reasons.length
      ? h(
          "ul",
          { class: "gate-reasons" },
          gate.reasons.map((r) =>
            h(
              "li",
              { dataset: { code: r.code } },
              h("code", {}, r.code),
              r.key ? ` — ${t(r.key)}` : null,
              r.explain ? h("p", { class: "gate-explain" }, t(r.explain)) : null,
            ),
          ),
        )
      : null,
    gate.warnings.length
      ? h(
          "div",
          { class: "warning gate-warnings" },
          h("strong", {}, t("serving.gate.warnings")),
          h("ul", {}, gate.warnings.map((w) => h("li", {}, w))),
        )
      : null,
  ];
}
