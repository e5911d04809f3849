// Formatting. Unknown (null/undefined) is always rendered as "unknown", never as 0.
import { t } from "./i18n.js";

export function fmtTime(iso) {
  if (!iso) return t("never");
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return t("unknown");
  return `${d.toISOString().slice(0, 16).replace("T", " ")} ${t("time.utc")}`;
}

export function fmtHour(ms) {
  return new Date(ms).toISOString().slice(0, 13).replace("T", " ") + ":00";
}

export function fmtNumber(v, digits = 0) {
  if (typeof v !== "number" || !Number.isFinite(v)) return t("unknown");
  return v.toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: 0 });
}

export function fmtPercent(v) {
  if (typeof v !== "number" || !Number.isFinite(v)) return t("unknown");
  return `${(v * 100).toFixed(1)}%`;
}
