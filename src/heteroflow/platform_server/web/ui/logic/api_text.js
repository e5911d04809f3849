// An API text in the page's language. Purely computational.
//
// Beside each English text it writes (alert messages and resolutions, history notes, prediction evidence and
// conclusions, the statistics' reasons) the API sends {code, params, text} (docs/api.md). A code the dictionary
// knows (key "api.<code>") is shown in the chosen language with its parameters; a text without a code, or with a
// code this page does not know yet, is shown as the API wrote it.
//
// ``tr`` is {t(key, params), has(key), time(iso)}: the dictionary lookup, whether a key exists, a time format.

const TIME_PARAMS = ["since", "at"];

/**
 * @param {{code: string|null, params?: Record<string, string>, text: string}|null|undefined} coded
 * @param {object} tr
 * @param {object[]} [evidence] the evidence lines the text quotes (an alert's ``message_evidence``)
 * @returns {string}
 */
export function codedText(coded, tr, evidence = []) {
  if (!coded || typeof coded !== "object") return "";
  const text = typeof coded.text === "string" ? coded.text : "";
  const key = typeof coded.code === "string" ? `api.${coded.code}` : null;
  if (!key || !tr.has(key)) return text;
  const params = { ...(coded.params ?? {}) };
  for (const name of TIME_PARAMS) if (params[name]) params[name] = tr.time(params[name]);
  if (params.label_code && tr.has(`api.label.${params.label_code}`)) params.label = tr.t(`api.label.${params.label_code}`);
  if (params.uuid !== undefined) params.uuid = ` (${params.uuid})`;
  else params.uuid = "";
  if (Array.isArray(evidence) && evidence.length && "evidence" in params) {
    params.evidence = evidence.map((line) => evidenceText(line, tr)).join("; ");
  }
  let out = tr.t(key, params);
  if (params.unconfirmed) out += tr.t("api.caveat.unconfirmed", { key: params.unconfirmed });
  return out;
}

/** One evidence line, "<layer> signal [<signal>]: <text>", in the page's language. */
export function evidenceText(line, tr) {
  const layer = tr.has(`api.layer.${line.layer}`) ? tr.t(`api.layer.${line.layer}`) : `${line.layer} signal`;
  return `${layer} [${line.signal}]: ${codedText(line, tr)}`;
}

/** A prediction's evidence, one line each; the English evidence when the API sent no lines. */
export function evidenceLinesText(prediction, tr) {
  const lines = Array.isArray(prediction.evidence_lines) ? prediction.evidence_lines : [];
  if (!lines.length) return typeof prediction.evidence === "string" ? prediction.evidence : "";
  return lines.map((line) => evidenceText(line, tr)).join("\n");
}
