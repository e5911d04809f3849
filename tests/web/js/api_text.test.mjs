import { test } from "node:test";
import assert from "node:assert/strict";
import { LANGUAGES } from "../../../src/heteroflow/platform_server/web/ui/i18n.js";
import { codedText, evidenceLinesText } from "../../../src/heteroflow/platform_server/web/ui/logic/api_text.js";

const tr = (lang) => ({
  t: (key, params = {}) => (LANGUAGES[lang][key] ?? key).replace(/\{(\w+)\}/g, (_, n) => (n in params ? String(params[n]) : `{${n}}`)),
  has: (key) => key in LANGUAGES.en,
  time: (iso) => `T(${iso})`,
});

const growth = {
  layer: "trend",
  signal: "corrected_ecc_growth",
  code: "evidence.corrected_growth",
  params: { increase: "90", window: "24h", min_increase: "32", ratio: "2.10", baseline_days: "7", min_ratio: "1.2", windows: "3", increases: "[40, 60, 90]" },
  text: "corrected ECC +90 in the last 24h (≥ 32), 2.10x the 7-day mean (≥ 1.2x); increases of the last 3 windows [40, 60, 90] strictly increase",
};

test("a known code renders in the chosen language with its parameters", () => {
  const zh = evidenceLinesText({ evidence: growth.text, evidence_lines: [growth] }, tr("zh"));
  assert.match(zh, /^趋势信号 \[corrected_ecc_growth\]: 最近 24h 可纠正 ECC 增加 90/);
  assert.match(zh, /\[40, 60, 90\] 严格递增$/);
  // the English rendering is the API's own text, word for word
  assert.equal(codedText(growth, tr("en")), growth.text);
});

test("an unknown code or a text without one is shown as the API wrote it", () => {
  assert.equal(codedText({ code: "evidence.from_the_future", params: {}, text: "new words" }, tr("zh")), "new words");
  assert.equal(codedText({ code: null, params: {}, text: "replaced the card" }, tr("zh")), "replaced the card");
  assert.equal(evidenceLinesText({ evidence: "old free text" }, tr("zh")), "old free text");
});

test("labels, times, the uuid and the quoted evidence of an alert are rendered too", () => {
  const hit = { code: "conclusion.hit_growth", params: { label: "uncorrectable ECC", label_code: "uncorrectable_ecc", start: "0", current: "2", at: "2026-05-02T00:00:00+00:00" }, text: "hit: …" };
  assert.equal(codedText(hit, tr("zh")), "命中：不可纠正 ECC于 T(2026-05-02T00:00:00+00:00) 从 0 增至 2");
  const message = {
    code: "alert.fault_predicted",
    params: { node: "gpu-07", gpu_index: "3", uuid: "GPU-3", window_days: "7", rule_version: "v1", evidence: growth.text },
    text: "Memory fault predicted …",
  };
  const zh = codedText(message, tr("zh"), [growth]);
  assert.match(zh, /^预测 gpu-07 GPU 3 \(GPU-3\) 将在 7 天内出现显存故障/);
  assert.match(zh, /证据：趋势信号 \[corrected_ecc_growth\]: 最近 24h/);
  const noUuid = { ...message, params: { ...message.params, uuid: undefined } };
  delete noUuid.params.uuid;
  assert.match(codedText(noUuid, tr("en"), [growth]), /^Memory fault predicted on gpu-07 GPU 3 within 7 days/);
});

test("the unconfirmed-semantics caveat follows the line", () => {
  const line = { layer: "strong", signal: "uncorrectable_ecc", code: "evidence.total_new", params: { label: "uncorrectable ECC", label_code: "uncorrectable_ecc", current: "3", unconfirmed: "ecc_uncorrected_total" }, text: "…" };
  assert.match(codedText(line, tr("zh")), /语义未确认：厂商尚未确认 ecc_uncorrected_total/);
});
