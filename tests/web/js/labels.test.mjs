import { test } from "node:test";
import assert from "node:assert/strict";
import { recogniseTypes } from "../../../src/heteroflow/platform_server/web/ui/logic/labels.js";

test("strong and trend lines name the prediction types, in order", () => {
  const evidence =
    "strong signal [uncorrectable_ecc]: uncorrectable ECC total 2 > 0\n" +
    "trend signal [corrected_ecc_growth]: Δ24h 40 ≥ 32 and ≥ 1.2 × mean";
  assert.deepEqual(recogniseTypes(evidence), ["uncorrectable_ecc", "corrected_ecc_growth"]);
});

test("weak-signal lines never change the label, whatever they say", () => {
  const evidence =
    "weak signal [temperature_high]: looks like strong signal [remap_failure]: maybe\n" +
    "trend signal [retired_pages_growth]: retired pages 0 → 2";
  assert.deepEqual(recogniseTypes(evidence), ["retired_pages_growth"]);
  assert.deepEqual(recogniseTypes("weak signal [uncorrectable_ecc]: hot card"), []);
});

test("unknown codes and free text are unrecognised (empty), not guessed", () => {
  assert.deepEqual(recogniseTypes("strong signal [xid_79]: fell off the bus"), []);
  assert.deepEqual(recogniseTypes("the card had uncorrectable ECC errors"), []);
  assert.deepEqual(recogniseTypes(""), []);
  assert.deepEqual(recogniseTypes(null), []);
});

test("repeats are reported once and CRLF is accepted", () => {
  const evidence = "strong signal [remap_failure]: 1\r\nstrong signal [remap_failure]: 2";
  assert.deepEqual(recogniseTypes(evidence), ["remap_failure"]);
});
