// Prediction-type labels recognised from a prediction's evidence text. Purely computational.
//
// Evidence lines look like "trend signal [corrected_ecc_growth]: …" or "strong signal [uncorrectable_ecc]: …".
// Only strong and trend lines name a prediction type: weak signals never make a prediction alone, so a weak
// line (whatever it says) must not change the label. Text we cannot recognise is "unrecognised" — never a guess.

export const PREDICTION_TYPES = Object.freeze([
  "uncorrectable_ecc",
  "remap_failure",
  "corrected_ecc_growth",
  "pending_remap_growth",
  "retired_pages_growth",
]);

const LINE = /^\s*(strong|trend)\s+signal\s+\[([a-z0-9_]+)\]\s*:/i;

/**
 * The known prediction types named by the evidence's strong/trend lines, in order, without repeats.
 * An empty list means "unrecognised".
 * @param {string|null|undefined} evidence
 * @returns {string[]}
 */
export function recogniseTypes(evidence) {
  if (typeof evidence !== "string") return [];
  const found = [];
  for (const line of evidence.split(/\r?\n/)) {
    const m = LINE.exec(line);
    if (!m) continue;
    const code = m[2].toLowerCase();
    if (PREDICTION_TYPES.includes(code) && !found.includes(code)) found.push(code);
  }
  return found;
}
