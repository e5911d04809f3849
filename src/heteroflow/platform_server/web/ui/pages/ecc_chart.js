// One hourly bar chart, drawn as SVG by our own code. Unknown hours are shaded and labelled, never drawn as 0.
import { h, s } from "../dom.js";
import { fmtHour, fmtNumber, fmtTime } from "../format.js";
import { t } from "../i18n.js";
import { timeTicks } from "../logic/axis.js";
import { counterLevel, coverage, hourlyIncreases, metricUnknown } from "../logic/hourly.js";

const WIDTH = 720; // the drawing's width: 1, 7 or 30 days, the bars share it (the chart keeps its height)
const HEIGHT = 120;
const TOP = 14;
const LABEL_WIDTH = 60; // an "unknown" text label needs a run of unknown hours this wide
const AXIS = 16; // the labelled time axis under the bars
const HOUR_MS = 3_600_000; // an "unknown" text label needs this many adjacent unknown hours to fit

let chartSerial = 0;

export function eccChart({ samples, key, title, fromMs, untilMs, staleMinutes, truncated }) {
  const heading = h("h3", {}, title);
  if (metricUnknown(samples, key)) {
    return h(
      "figure",
      { class: "chart metric-unknown", dataset: { metric: key, state: "unknown" } },
      heading,
      h("p", { class: "big-unknown" }, t("unknown")),
      h("p", { class: "muted" }, t("ecc.metric_unknown")),
    );
  }
  const hours = hourlyIncreases(samples, { key, fromMs, untilMs, staleMinutes, truncated });
  const cov = coverage(hours);
  const max = Math.max(1, ...hours.filter((x) => x.value !== null).map((x) => x.value));
  const width = WIDTH;
  const BAR = width / Math.max(1, hours.length);
  const level = counterLevel(samples, key);
  const pattern = `hatch-${++chartSerial}`;
  const plot = HEIGHT - TOP;
  const bars = hours.map((hour, i) => {
    const x = i * BAR;
    const start = fmtHour(hour.start);
    if (hour.value === null) {
      const reason = t(`ecc.reason.${hour.reason}`);
      return s(
        "rect",
        {
          x,
          y: TOP,
          width: BAR,
          height: plot,
          fill: `url(#${pattern})`,
          class: "bar-unknown",
          dataset: { start: new Date(hour.start).toISOString(), reason: hour.reason },
        },
        s("title", {}, t("ecc.bar_unknown", { start, reason })),
      );
    }
    // A known 0 is a thin line on the axis: visibly different from an unknown (shaded) hour.
    const barHeight = hour.value === 0 ? 1 : Math.max(2, (hour.value / max) * plot);
    return s(
      "rect",
      {
        x: x + Math.min(0.5, BAR / 8),
        y: HEIGHT - barHeight,
        width: Math.max(0.6, BAR - Math.min(1, BAR / 4)),
        height: barHeight,
        class: hour.value === 0 ? "bar bar-zero" : "bar",
        dataset: { start: new Date(hour.start).toISOString(), value: hour.value },
      },
      s("title", {}, t("ecc.bar", { start, value: hour.value })),
    );
  });
  const labels = [];
  for (let i = 0; i < hours.length; ) {
    if (hours[i].value !== null) {
      i += 1;
      continue;
    }
    let j = i;
    while (j < hours.length && hours[j].value === null) j += 1;
    if ((j - i) * BAR >= LABEL_WIDTH) {
      labels.push(
        s("text", { x: ((i + j) / 2) * BAR, y: TOP + plot / 2, class: "unknown-label", "text-anchor": "middle" }, t("unknown.short")),
      );
    }
    i = j;
  }
  // the time axis: a tick and a UTC label at each step (hours over a day, days over a week or a month)
  const first = hours.length ? hours[0].start : fromMs;
  const ticks = timeTicks(first, hours.length ? hours.at(-1).start + HOUR_MS : untilMs).map((tick) => {
    const x = ((tick.at - first) / HOUR_MS) * BAR;
    return s(
      "g",
      { class: "tick", dataset: { at: new Date(tick.at).toISOString() } },
      s("line", { x1: x, y1: HEIGHT, x2: x, y2: HEIGHT + 4, class: "axis" }),
      s("text", { x, y: HEIGHT + AXIS - 2, class: "tick-label", "text-anchor": "middle" }, tick.label),
    );
  });
  const svg = s(
    "svg",
    {
      viewBox: `-12 0 ${width + 24} ${HEIGHT + AXIS}`,
      role: "img",
      "aria-label": `${title}. ${t("ecc.coverage", { computable: cov.computable, total: cov.total, sum: fmtNumber(cov.sum) })}`,
      class: "bars",
    },
    s(
      "defs",
      {},
      s(
        "pattern",
        { id: pattern, width: 6, height: 6, patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)" },
        s("rect", { width: 6, height: 6, class: "hatch-bg" }),
        s("line", { x1: 0, y1: 0, x2: 0, y2: 6, class: "hatch-line" }),
      ),
    ),
    s("line", { x1: 0, y1: HEIGHT - 0.5, x2: width, y2: HEIGHT - 0.5, class: "axis" }),
    s("text", { x: 2, y: 10, class: "axis-label" }, t("ecc.axis_max", { max: fmtNumber(max) })),
    bars,
    labels,
    ticks,
  );
  return h(
    "figure",
    {
      class: "chart",
      dataset: { metric: key, state: "known", computable: cov.computable, total: cov.total },
    },
    heading,
    svg,
    level
      ? h(
          "p",
          { class: "level", dataset: { level: level.last, first: level.first } },
          t(level.swapped ? "ecc.level_swapped" : "ecc.level", {
            last: fmtNumber(level.last),
            first: fmtNumber(level.first),
            at: fmtTime(level.lastAt),
          }),
        )
      : null,
    h(
      "figcaption",
      { class: "coverage" },
      t("ecc.coverage", { computable: cov.computable, total: cov.total, sum: fmtNumber(cov.sum) }),
    ),
  );
}
