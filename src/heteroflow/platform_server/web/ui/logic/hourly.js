// Hourly counter increases for the ECC rate chart. Purely computational: no DOM, no fetch, no clock.
//
// An hour [m, m + 1h) has a value only when all three conditions of the design hold
// (docs/design/gpu-health-design.md, "The page"); otherwise it is unknown
// (null) — never 0, and never a negative bar:
//   1. at both marks the latest sample at or before the mark exists, is no older than the stall threshold
//      (an old value carried forward would be invented data) and its counter is readable (non-null);
//   2. both samples belong to the same physical card (same uuid: a swapped card's counter cannot be
//      subtracted from the old card's);
//   3. the increase is >= 0 (a driver reset or a wrapped counter is unknown, not clamped to 0).

export const HOUR_MS = 3_600_000;

/** @typedef {{sampled_at: string, uuid: string|null, [key: string]: any}} Sample */

/**
 * The newest sample at or before `markMs` (samples ascending by time), or null.
 * @param {{t: number, s: Sample}[]} timed
 * @param {number} markMs
 */
function latestAtOrBefore(timed, markMs) {
  let lo = 0;
  let hi = timed.length - 1;
  let found = -1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    if (timed[mid].t <= markMs) {
      found = mid;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  return found < 0 ? null : timed[found];
}

/**
 * The value of `key` at an hour mark, or the reason it is unknown.
 * @returns {{value: number, uuid: string|null} | {reason: string}}
 */
export function valueAtMark(timed, markMs, key, staleMs, loadedFromMs) {
  const hit = latestAtOrBefore(timed, markMs);
  if (hit === null) {
    // With truncation (or before the period start) an older sample may exist but was not loaded.
    return { reason: loadedFromMs !== null && markMs < loadedFromMs ? "not_loaded" : "no_sample" };
  }
  if (markMs - hit.t > staleMs) return { reason: "stale" };
  const value = hit.s[key];
  if (value === null || value === undefined || typeof value !== "number" || !Number.isFinite(value)) {
    return { reason: "unreadable" };
  }
  return { value, uuid: hit.s.uuid ?? null };
}

/**
 * Hourly increases of `key` for every whole hour whose both marks lie in [fromMs, untilMs].
 *
 * @param {Sample[]} samples ascending by sampled_at (as the samples API returns them)
 * @param {object} opts
 * @param {string} opts.key counter name, e.g. "ecc_corrected_total"
 * @param {number} opts.fromMs start of the loaded period (the API's `since`), ms since epoch
 * @param {number} opts.untilMs end of the chart (the fetch time), ms since epoch
 * @param {number} opts.staleMinutes the stall threshold, minutes (the capabilities API's value, default 60)
 * @param {boolean} [opts.truncated] the API kept only the newest samples: earlier marks were not loaded
 * @returns {{start: number, end: number, value: number|null, reason: string|null}[]}
 */
export function hourlyIncreases(samples, { key, fromMs, untilMs, staleMinutes, truncated = false }) {
  const timed = samples
    .map((s) => ({ t: Date.parse(s.sampled_at), s }))
    .filter((x) => Number.isFinite(x.t))
    .sort((a, b) => a.t - b.t);
  const staleMs = staleMinutes * 60_000;
  // Marks before the first loaded sample cannot be judged when older samples exist but were cut off
  // (truncation) or lie before the requested period; both read "not loaded", never 0.
  const loadedFromMs = truncated && timed.length > 0 ? timed[0].t : fromMs;
  const hours = [];
  const firstMark = Math.ceil(fromMs / HOUR_MS) * HOUR_MS;
  for (let start = firstMark; start + HOUR_MS <= untilMs; start += HOUR_MS) {
    const end = start + HOUR_MS;
    const a = valueAtMark(timed, start, key, staleMs, loadedFromMs);
    const b = valueAtMark(timed, end, key, staleMs, loadedFromMs);
    let value = null;
    let reason = null;
    if ("reason" in a) reason = a.reason;
    else if ("reason" in b) reason = b.reason;
    else if (a.uuid !== b.uuid) reason = "card_swap";
    else if (b.value - a.value < 0) reason = "decrease";
    else value = b.value - a.value;
    hours.push({ start, end, value, reason });
  }
  return hours;
}

/**
 * Coverage of a series of hours: computable / total, and the sum of the known increases.
 * The sum is null (unknown) when no hour is computable — never 0.
 */
export function coverage(hours) {
  const known = hours.filter((h) => h.value !== null);
  return {
    computable: known.length,
    total: hours.length,
    sum: known.length === 0 ? null : known.reduce((acc, h) => acc + h.value, 0),
  };
}

/** True when no loaded sample carries a readable value of `key`: the whole metric is unknown. */
export function metricUnknown(samples, key) {
  return !samples.some((s) => typeof s[key] === "number" && Number.isFinite(s[key]));
}

/**
 * The counter's absolute level in the loaded samples: the first and the last readable value of ``key`` (samples
 * ascending by time), when the last was sampled and whether the card (uuid) changed in between; null when no
 * sample has a readable value (unknown is never 0).
 * @returns {{first: number, last: number, lastAt: string, swapped: boolean} | null}
 */
export function counterLevel(samples, key) {
  let first = null;
  let last = null;
  for (const sample of samples) {
    const value = sample[key];
    if (typeof value !== "number" || !Number.isFinite(value)) continue;
    if (first === null) first = sample;
    last = sample;
  }
  if (first === null || last === null) return null;
  return { first: first[key], last: last[key], lastAt: last.sampled_at, swapped: first.uuid !== last.uuid };
}
