// The ECC chart's time axis: where its ticks go and what they say. Purely computational.
//
// Ticks sit on UTC hour boundaries at a step that keeps about six to ten labels whatever the range: every 3 h over
// a day, every day over a week, every 5 days over a month. A label is "HH:00" for steps under a day, "MM-DD"
// otherwise (UTC, like every time on the pages).

const HOUR = 3_600_000;
const DAY = 24 * HOUR;
const STEPS = [HOUR, 2 * HOUR, 3 * HOUR, 6 * HOUR, 12 * HOUR, DAY, 2 * DAY, 5 * DAY, 7 * DAY, 14 * DAY];

/** The chart ranges the page offers, in days. */
export const RANGES = Object.freeze([1, 7, 30]);
export const DEFAULT_RANGE = 7;

/**
 * @param {number} fromMs start of the charted period
 * @param {number} untilMs its end
 * @param {number} [maxTicks]
 * @returns {{at: number, label: string}[]} ticks inside [fromMs, untilMs], ascending
 */
export function timeTicks(fromMs, untilMs, maxTicks = 10) {
  if (!Number.isFinite(fromMs) || !Number.isFinite(untilMs) || untilMs <= fromMs) return [];
  const span = untilMs - fromMs;
  const step = STEPS.find((s) => span / s <= maxTicks) ?? STEPS.at(-1);
  const ticks = [];
  // day steps start at a UTC midnight; hour steps at a multiple of the step since midnight
  let at = Math.ceil(fromMs / step) * step;
  if (step >= DAY) at = Math.ceil(fromMs / DAY) * DAY;
  for (; at <= untilMs; at += step) ticks.push({ at, label: tickLabel(at, step) });
  return ticks;
}

export function tickLabel(atMs, step) {
  const iso = new Date(atMs).toISOString();
  return step < DAY ? `${iso.slice(11, 13)}:00` : iso.slice(5, 10);
}
