import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { LANGUAGES } from "../../../src/heteroflow/platform_server/web/ui/i18n.js";
import { RUNBOOKS, runbookOf } from "../../../src/heteroflow/platform_server/web/ui/logic/runbooks.js";

const REPO = new URL("../../../", import.meta.url);

test("every platform alert type's runbook has its steps in English and Chinese, and its page exists", () => {
  assert.deepEqual(Object.keys(RUNBOOKS).sort(), ["GPU_FAULT_PREDICTED", "GPU_MEMORY_HIGH", "NODE_CARDS_REFUSED"]);
  for (const type of Object.keys(RUNBOOKS)) {
    const { keys, path } = runbookOf(type);
    assert.equal(keys.length, RUNBOOKS[type].steps);
    for (const key of keys) {
      assert.ok(LANGUAGES.en[key], `en ${key}`);
      assert.ok(LANGUAGES.zh[key], `zh ${key}`);
      assert.notEqual(LANGUAGES.zh[key], LANGUAGES.en[key], key);
    }
    assert.ok(existsSync(new URL(path, REPO)), path);
  }
  // no step beyond the count: a key the page would never show is a step the count forgot
  const shown = new Set(Object.keys(RUNBOOKS).flatMap((type) => runbookOf(type).keys));
  const written = Object.keys(LANGUAGES.en).filter((key) => /^alerts\.runbook\.[A-Z_]+\.\d+$/.test(key));
  assert.deepEqual(written.sort(), [...shown].sort());
});

test("a type without a runbook has none, and odd input is no type", () => {
  assert.equal(runbookOf("SOMETHING_ELSE"), null);
  assert.equal(runbookOf(undefined), null);
  assert.equal(runbookOf("constructor"), null);
  assert.equal(runbookOf("__proto__"), null);
});
