// The statistics card's state. Purely computational.
//
// The page itself confirms the evidence gate (>= 20 matured predictions and >= 8 days observed) before it shows
// a ratio: the back end guards the same rule, and each side holds it independently. Below the gate the card
// shows "not enough samples" with its reasons — a 0% would read as "every prediction was wrong" when the truth
// is "not enough data yet". The raw counts are always shown.

export const MIN_MATURED = 20;
export const MIN_SPAN_DAYS = 8;

/**
 * @param {object} band one element of prediction-stats `windows`
 * @param {object} stats the prediction-stats response (span_days, min_matured, min_span_days)
 * @returns {{sufficient: boolean, matured: number, reasons: {code: string, [k: string]: any}[],
 *            precision: number|null, recall: number|null, apiReasons: {code: string|null, params: object, text: string}[]}}
 * ``apiReasons`` are the API's own reasons with their codes (``insufficient_codes``; only the English text when an
 * older server sends none).
 */
export function statsCardState(band, stats) {
  const matured = num(band.hit) + num(band.miss);
  const minMatured = Math.max(MIN_MATURED, num(stats.min_matured));
  const minSpan = Math.max(MIN_SPAN_DAYS, num(stats.min_span_days));
  const span = typeof stats.span_days === "number" && Number.isFinite(stats.span_days) ? stats.span_days : null;
  const reasons = [];
  if (matured < minMatured) reasons.push({ code: "matured", matured, min: minMatured });
  if (span === null) reasons.push({ code: "span_unknown", min: minSpan });
  else if (span < minSpan) reasons.push({ code: "span", span, min: minSpan });
  const texts = Array.isArray(band.insufficient) ? band.insufficient.map(String) : [];
  const coded = Array.isArray(band.insufficient_codes) ? band.insufficient_codes : [];
  const apiReasons =
    coded.length === texts.length && coded.length
      ? coded.map((c) => ({ code: typeof c.code === "string" ? c.code : null, params: c.params ?? {}, text: String(c.text) }))
      : texts.map((text) => ({ code: null, params: {}, text }));
  // The API withholding ratios is also "insufficient", even when our own gate passes (a stricter server gate).
  const apiWithheld = band.precision === null || band.precision === undefined;
  if (reasons.length === 0 && apiWithheld) reasons.push({ code: "api" });
  const sufficient = reasons.length === 0;
  return {
    sufficient,
    matured,
    reasons,
    apiReasons,
    precision: sufficient ? ratio(band.precision) : null,
    recall: sufficient ? ratio(band.recall) : null,
  };
}

function num(v) {
  return typeof v === "number" && Number.isFinite(v) ? v : 0;
}

function ratio(v) {
  return typeof v === "number" && Number.isFinite(v) ? v : null;
}
