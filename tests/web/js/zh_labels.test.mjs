import { test } from "node:test";
import assert from "node:assert/strict";
import { LANGUAGES } from "../../../src/heteroflow/platform_server/web/ui/i18n.js";

test("labels an operator reported as English on the Chinese pages are Chinese", () => {
  assert.ok(!/^Rank\b/.test(LANGUAGES.zh["serving.rank"]), LANGUAGES.zh["serving.rank"]);
  assert.match(LANGUAGES.zh["serving.rank"], /副本/);
  assert.match(LANGUAGES.zh["serving.pod.col.id"], /容器组/);
  for (const key of ["alerts.severity.CRITICAL", "alerts.severity.WARN", "alerts.acknowledge", "caps.unknown", "caps.export"]) {
    assert.notEqual(LANGUAGES.zh[key], LANGUAGES.en[key], key);
  }
});
