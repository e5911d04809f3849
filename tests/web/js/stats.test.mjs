import { test } from "node:test";
import assert from "node:assert/strict";
import { statsCardState } from "../../../src/heteroflow/platform_server/web/ui/logic/stats.js";

const band = (over = {}) => ({
  window_days: 7, pending: 1, hit: 15, miss: 5, voided: 2, matured: 20,
  failed_cards: 4, predicted_cards: 3, missed_cards: 1, precision: 0.75, recall: 0.75, insufficient: [],
  ...over,
});
const stats = (over = {}) => ({ span_days: 10, min_matured: 20, min_span_days: 8, ...over });

test("sufficient: 20 matured and 8 days show the ratios", () => {
  const state = statsCardState(band(), stats({ span_days: 8 }));
  assert.equal(state.sufficient, true);
  assert.equal(state.precision, 0.75);
  assert.equal(state.recall, 0.75);
});

test("19 matured is insufficient even if the API sent ratios", () => {
  const state = statsCardState(band({ hit: 14, matured: 19 }), stats());
  assert.equal(state.sufficient, false);
  assert.equal(state.precision, null);
  assert.deepEqual(state.reasons, [{ code: "matured", matured: 19, min: 20 }]);
});

test("voided predictions never count as matured", () => {
  const state = statsCardState(band({ hit: 10, miss: 0, voided: 50 }), stats());
  assert.equal(state.sufficient, false);
  assert.equal(state.matured, 10);
});

test("a span under 8 days or unknown is insufficient with its reason", () => {
  assert.deepEqual(statsCardState(band(), stats({ span_days: 7.9 })).reasons, [{ code: "span", span: 7.9, min: 8 }]);
  assert.deepEqual(statsCardState(band(), stats({ span_days: null })).reasons, [{ code: "span_unknown", min: 8 }]);
});

test("the front-end gate is never looser than 20 / 8, even if the server's is", () => {
  const state = statsCardState(band({ hit: 5, miss: 5 }), stats({ min_matured: 5, min_span_days: 1, span_days: 2 }));
  assert.equal(state.sufficient, false);
  assert.equal(state.reasons.length, 2);
});

test("the API withholding ratios keeps the card insufficient", () => {
  const state = statsCardState(band({ precision: null, recall: null, insufficient: ["stricter"] }), stats({ min_matured: 50 }));
  assert.equal(state.sufficient, false);
  assert.deepEqual(state.apiReasons, [{ code: null, params: {}, text: "stricter" }]);
});

test("the API's reasons keep their codes and parameters when it sends them", () => {
  const insufficient_codes = [{ code: "stats.matured", params: { matured: "3", min: "50" }, text: "3 of ≥ 50 …" }];
  const state = statsCardState(band({ precision: null, insufficient: ["3 of ≥ 50 …"], insufficient_codes }), stats());
  assert.deepEqual(state.apiReasons, [{ code: "stats.matured", params: { matured: "3", min: "50" }, text: "3 of ≥ 50 …" }]);
});

test("a null recall with sufficient evidence stays null (unknown), never 0", () => {
  const state = statsCardState(band({ failed_cards: 0, predicted_cards: 0, recall: null }), stats());
  assert.equal(state.sufficient, true);
  assert.equal(state.recall, null);
});
