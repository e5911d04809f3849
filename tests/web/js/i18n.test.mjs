import { test } from "node:test";
import assert from "node:assert/strict";
import { LANGUAGES } from "../../../src/heteroflow/platform_server/web/ui/i18n.js";

test("English and Chinese are both complete: the same keys, no empty string", () => {
  const en = Object.keys(LANGUAGES.en).sort();
  const zh = Object.keys(LANGUAGES.zh).sort();
  assert.deepEqual(zh, en);
  for (const [lang, table] of Object.entries(LANGUAGES)) {
    for (const [key, text] of Object.entries(table)) assert.ok(text.length > 0, `${lang}.${key} is empty`);
  }
});

test("placeholders match between the languages", () => {
  const names = (text) => [...text.matchAll(/\{(\w+)\}/g)].map((m) => m[1]).sort();
  for (const key of Object.keys(LANGUAGES.en)) {
    assert.deepEqual(names(LANGUAGES.zh[key]), names(LANGUAGES.en[key]), key);
  }
});

test("the design's Chinese wording is used", () => {
  assert.equal(LANGUAGES.zh["stats.insufficient"], "样本不足，暂不给命中率");
  assert.equal(LANGUAGES.zh["type.unrecognised"], "未识别");
  assert.equal(LANGUAGES.zh["caps.stalled"], "采集停滞");
  assert.match(LANGUAGES.zh["pred.empty"], /没有预测记录不代表所有卡都健康——没有采集能力的卡不会被预测/);
  assert.match(LANGUAGES.zh["calibration.heading"], /初始经验阈值，待真实数据校准/);
});

test("the API's coded texts read the same as the API in English, and have a Chinese text", async () => {
  const { readFile } = await import("node:fs/promises");
  const stats = await readFile(new URL("../../../src/heteroflow/health/statistics.py", import.meta.url), "utf8");
  const caps = await readFile(new URL("../../../src/heteroflow/platform_server/routes/gpu_health.py", import.meta.url), "utf8");
  const pyString = (source, name) => {
    const block = source.split(`${name} = (`)[1].split("\n)")[0];
    return [...block.matchAll(/"((?:[^"\\]|\\.)*)"/g)].map((m) => m[1]).join("");
  };
  const disclaimer = pyString(stats, "DISCLAIMER").replace("{min_matured}", "{min_matured}").replace("{min_span:g}", "{min_span}");
  assert.equal(LANGUAGES.en["api.prediction.uncalibrated"], disclaimer);
  assert.equal(LANGUAGES.en["api.capabilities.observed"], pyString(caps, "CAPABILITIES_NOTE"));
  for (const key of ["api.prediction.uncalibrated", "api.capabilities.observed"]) assert.notEqual(LANGUAGES.zh[key], LANGUAGES.en[key]);
});
