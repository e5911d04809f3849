import { test } from "node:test";
import assert from "node:assert/strict";
import { HOUR_MS, counterLevel, coverage, hourlyIncreases, metricUnknown } from "../../../src/heteroflow/platform_server/web/ui/logic/hourly.js";

const T0 = Date.parse("2026-11-30T00:00:00Z");
const at = (minutes) => new Date(T0 + minutes * 60_000).toISOString();
const s = (minutes, value, uuid = "GPU-A") => ({ sampled_at: at(minutes), uuid, ecc_corrected_total: value });
const run = (samples, opts = {}) =>
  hourlyIncreases(samples, {
    key: "ecc_corrected_total",
    fromMs: T0,
    untilMs: T0 + 3 * HOUR_MS,
    staleMinutes: 60,
    ...opts,
  });

test("fresh samples at both marks give the increase", () => {
  const hours = run([s(0, 10), s(55, 12), s(60, 15), s(115, 15), s(120, 20), s(180, 21)]);
  assert.deepEqual(hours.map((h) => h.value), [5, 5, 1]);
  assert.ok(hours.every((h) => h.reason === null));
});

test("a zero increase is a known 0, distinct from unknown", () => {
  const hours = run([s(0, 7), s(30, 7), s(60, 7), s(90, 7), s(120, 7), s(180, 7)]);
  assert.deepEqual(hours.map((h) => h.value), [0, 0, 0]);
});

test("a negative delta (driver reset) is unknown, never clamped to 0", () => {
  const hours = run([s(0, 100), s(60, 3), s(120, 4), s(180, 9)]);
  assert.equal(hours[0].value, null);
  assert.equal(hours[0].reason, "decrease");
  assert.deepEqual(hours.slice(1).map((h) => h.value), [1, 5]);
});

test("a card swap between the marks is unknown even when the counter rises", () => {
  const hours = run([s(0, 1), s(60, 2), s(100, 50, "GPU-B"), s(120, 60, "GPU-B"), s(180, 61, "GPU-B")]);
  assert.equal(hours[0].value, 1);
  assert.equal(hours[1].value, null);
  assert.equal(hours[1].reason, "card_swap");
  assert.equal(hours[2].value, 1);
});

test("a stale endpoint (latest sample older than the stall threshold) is unknown", () => {
  // Marks: 60 → s(50) fresh; 120 → s(50) is 70 minutes old: stale.
  const hours = run([s(0, 1), s(50, 2), s(125, 3), s(180, 4)]);
  assert.equal(hours[0].value, 1);
  assert.equal(hours[1].value, null);
  assert.equal(hours[1].reason, "stale");
  assert.equal(hours[2].value, null); // its start mark (120) is stale too
});

test("stale endpoints: exactly at the threshold is fresh, beyond it is unknown", () => {
  const fresh = run([s(0, 1), s(120, 5)], { untilMs: T0 + 2 * HOUR_MS });
  // mark 60 → s(0) is 60 min old: fresh (≤ threshold); mark 120 → s(120)
  assert.deepEqual(fresh.map((h) => h.value), [0, 4]);
  const stale = run([s(0, 1), s(121, 5)], { untilMs: T0 + 2 * HOUR_MS });
  // mark 120 → s(0) is 120 min old → stale
  assert.equal(stale[0].value, 0);
  assert.equal(stale[1].value, null);
  assert.equal(stale[1].reason, "stale");
});

test("an unreadable counter at a mark is unknown", () => {
  const hours = run([s(0, 1), s(60, null), s(120, 3), s(180, 4)]);
  assert.deepEqual(hours.map((h) => h.value), [null, null, 1]);
  assert.equal(hours[0].reason, "unreadable");
});

test("no sample at or before a mark is unknown", () => {
  const hours = run([s(70, 1), s(120, 2), s(180, 3)]);
  assert.equal(hours[0].value, null);
  assert.equal(hours[0].reason, "no_sample");
  assert.equal(hours[1].reason, "no_sample");
  assert.equal(hours[2].value, 1);
});

test("truncation: marks before the first loaded sample read 'not loaded'", () => {
  const hours = run([s(61, 1), s(120, 2), s(180, 3)], { truncated: true });
  assert.equal(hours[0].value, null);
  assert.equal(hours[0].reason, "not_loaded");
  // mark 60 precedes the first loaded sample too
  assert.equal(hours[1].reason, "not_loaded");
  assert.equal(hours[2].value, 1);
});

test("only whole hours up to the end are charted", () => {
  const hours = run([s(0, 1)], { untilMs: T0 + 2.5 * HOUR_MS });
  assert.equal(hours.length, 2);
  assert.equal(hours[0].start, T0);
});

test("coverage counts computable hours and sums; no computable hour means an unknown sum, not 0", () => {
  const hours = run([s(0, 1), s(60, 4), s(120, 2), s(180, 3)]);
  assert.deepEqual(coverage(hours), { computable: 2, total: 3, sum: 4 });
  assert.deepEqual(coverage(run([])), { computable: 0, total: 3, sum: null });
});

test("a metric with no readable value is wholly unknown", () => {
  assert.equal(metricUnknown([s(0, null), s(60, null)], "ecc_corrected_total"), true);
  assert.equal(metricUnknown([], "ecc_corrected_total"), true);
  assert.equal(metricUnknown([s(0, 0)], "ecc_corrected_total"), false);
});

test("the counter's absolute level: first and last readable values, unknown is never 0", () => {
  const at = (m) => new Date(Date.UTC(2026, 4, 20, 0, m)).toISOString();
  const samples = [
    { sampled_at: at(0), uuid: "GPU-1", ecc_uncorrected_total: null },
    { sampled_at: at(1), uuid: "GPU-1", ecc_uncorrected_total: 98 },
    { sampled_at: at(2), uuid: "GPU-1", ecc_uncorrected_total: 103 },
    { sampled_at: at(3), uuid: "GPU-1", ecc_uncorrected_total: null },
  ];
  assert.deepEqual(counterLevel(samples, "ecc_uncorrected_total"), {
    first: 98,
    last: 103,
    lastAt: at(2),
    swapped: false,
  });
  assert.equal(counterLevel(samples, "retired_pages"), null);
  assert.equal(counterLevel([{ sampled_at: at(0), uuid: "x", retired_pages: null }], "retired_pages"), null);
  const swapped = [...samples, { sampled_at: at(4), uuid: "GPU-2", ecc_uncorrected_total: 0 }];
  assert.deepEqual(counterLevel(swapped, "ecc_uncorrected_total"), { first: 98, last: 0, lastAt: at(4), swapped: true });
});
