// Sparkline geometry for one GPU metric over time. Purely computational (no DOM).
//
// A point whose metric is unknown (null: not reported that step) breaks the line into segments: a gap is drawn
// as a gap, never as a drop to 0. Memory is shown as the share of the card's memory in use, in percent.

export const SPARK_METRICS = Object.freeze(["utilization_pct", "memory_pct", "temperature_c", "power_w"]);

/**
 * The average of a metric at one point, or null when unknown.
 * @param {object} point one point of GET /api/v1/nodes/{id}/gpu-metrics
 * @param {string} metric one of SPARK_METRICS
 * @returns {number|null}
 */
export function pointValue(point, metric) {
  if (metric === "memory_pct") {
    const used = point.memory_used_mib;
    const total = point.memory_total_mib;
    if (!used || !total || !(total.avg > 0)) return null;
    return Math.min(100, (used.avg / total.avg) * 100);
  }
  const agg = point[metric];
  return agg && Number.isFinite(agg.avg) ? agg.avg : null;
}

/**
 * Polyline segments (SVG coordinates) of a metric's series, with gaps where it is unknown.
 * @param {object[]} points the series, ascending by time
 * @param {string} metric
 * @param {{width: number, height: number, fromMs: number, untilMs: number}} box
 * @returns {{segments: number[][][], known: number, unknown: number, last: number|null, min: number|null, max: number|null}}
 */
export function sparkline(points, metric, { width, height, fromMs, untilMs }) {
  const values = points.map((p) => ({ t: Date.parse(p.t), v: pointValue(p, metric) }));
  const known = values.filter((x) => x.v !== null);
  if (known.length === 0) {
    return { segments: [], known: 0, unknown: values.length, last: null, min: null, max: null };
  }
  const min = Math.min(...known.map((x) => x.v));
  const max = Math.max(...known.map((x) => x.v));
  // percentages keep their 0..100 scale so that two cards compare at a glance; other metrics fit their range
  const lo = metric.endsWith("_pct") ? 0 : min;
  const hi = metric.endsWith("_pct") ? 100 : max;
  const span = hi - lo || 1;
  const range = Math.max(1, untilMs - fromMs);
  const segments = [];
  let current = null;
  for (const { t, v } of values) {
    if (v === null) {
      current = null;
      continue;
    }
    const x = Math.round(((t - fromMs) / range) * width * 10) / 10;
    const y = Math.round((height - ((v - lo) / span) * height) * 10) / 10;
    if (current === null) {
      current = [];
      segments.push(current);
    }
    current.push([x, y]);
  }
  return { segments, known: known.length, unknown: values.length - known.length, last: known.at(-1).v, min, max };
}
