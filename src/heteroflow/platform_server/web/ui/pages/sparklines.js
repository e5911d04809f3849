// Per-GPU sparklines of a node's metrics history, drawn as SVG by our own code. Unknown steps are gaps, never 0.
import { h, s } from "../dom.js";
import { fmtNumber } from "../format.js";
import { t } from "../i18n.js";
import { SPARK_METRICS, sparkline } from "../logic/sparkline.js";

const WIDTH = 120;
const HEIGHT = 24;

function spark(points, metric, box) {
  const line = sparkline(points, metric, { ...box, width: WIDTH, height: HEIGHT });
  const label = t(`spark.${metric}`);
  if (line.known === 0) {
    return h(
      "div",
      { class: "spark spark-unknown", dataset: { metric, state: "unknown" } },
      h("span", { class: "spark-label" }, label),
      h("span", { class: "muted" }, t("unknown")),
    );
  }
  const paths = line.segments.map((seg) =>
    seg.length === 1
      ? s("circle", { cx: seg[0][0], cy: seg[0][1], r: 1.2, class: "spark-dot" })
      : s("polyline", { points: seg.map(([x, y]) => `${x},${y}`).join(" "), class: "spark-line" }),
  );
  const summary = t("spark.summary", {
    last: fmtNumber(line.last),
    min: fmtNumber(line.min),
    max: fmtNumber(line.max),
    unit: t(`spark.unit.${metric}`),
  });
  return h(
    "div",
    { class: "spark", dataset: { metric, segments: String(line.segments.length), unknown: String(line.unknown) } },
    h("span", { class: "spark-label" }, label),
    s(
      "svg",
      { viewBox: `0 0 ${WIDTH} ${HEIGHT}`, width: WIDTH, height: HEIGHT, role: "img", "aria-label": `${label}: ${summary}` },
      s("title", {}, `${label}: ${summary}`),
      paths,
    ),
    h("span", { class: "spark-value" }, `${fmtNumber(line.last)} ${t(`spark.unit.${metric}`)}`),
  );
}

/** The sparklines of every GPU in one gpu-metrics response; ``period`` names the range asked for. */
export function gpuSparklines(body, period = t("spark.period.1")) {
  const box = { fromMs: Date.parse(body.since), untilMs: Date.parse(body.until) };
  if (body.gpus.length === 0) return h("p", { class: "empty" }, t("spark.empty", { period }));
  return h(
    "div",
    { class: "sparks" },
    body.gpus.map((gpu) =>
      h(
        "div",
        { class: "spark-gpu", dataset: { gpu: String(gpu.gpu_index) } },
        h("span", { class: "card-name" }, `GPU ${gpu.gpu_index}`),
        gpu.uuid ? h("code", { class: "uuid" }, gpu.uuid) : null,
        SPARK_METRICS.map((metric) => spark(gpu.points, metric, box)),
      ),
    ),
    h(
      "p",
      { class: "muted" },
      t("spark.note", { period, step: t("spark.step", { minutes: Math.max(1, Math.round((body.step_seconds ?? 60) / 60)) }) }),
    ),
  );
}
