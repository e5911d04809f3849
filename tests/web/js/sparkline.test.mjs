import { test } from "node:test";
import assert from "node:assert/strict";
import { pointValue, sparkline } from "../../../src/heteroflow/platform_server/web/ui/logic/sparkline.js";

const agg = (v) => ({ min: v, avg: v, max: v });
const at = (m) => new Date(Date.UTC(2026, 2, 1, 12, m)).toISOString();
const box = { width: 60, height: 10, fromMs: Date.parse(at(0)), untilMs: Date.parse(at(6)) };

test("unknown steps break the line into segments, never a drop to 0", () => {
  const points = [
    { t: at(0), temperature_c: agg(40) },
    { t: at(1), temperature_c: agg(50) },
    { t: at(2), temperature_c: null },
    { t: at(3), temperature_c: agg(60) },
  ];
  const line = sparkline(points, "temperature_c", box);
  assert.equal(line.segments.length, 2);
  assert.deepEqual(line.segments[0], [[0, 10], [10, 5]]);
  assert.deepEqual(line.segments[1], [[30, 0]]);
  assert.equal(line.unknown, 1);
  assert.equal(line.last, 60);
  assert.equal(line.min, 40);
});

test("a metric unknown at every step has no line at all", () => {
  const line = sparkline([{ t: at(0), power_w: null }], "power_w", box);
  assert.deepEqual(line.segments, []);
  assert.equal(line.last, null);
});

test("memory is the share in use; unknown used or total is unknown", () => {
  assert.equal(pointValue({ memory_used_mib: agg(40), memory_total_mib: agg(80) }, "memory_pct"), 50);
  assert.equal(pointValue({ memory_used_mib: null, memory_total_mib: agg(80) }, "memory_pct"), null);
  assert.equal(pointValue({ memory_used_mib: agg(1), memory_total_mib: agg(0) }, "memory_pct"), null);
  // percentages keep their 0..100 scale: 50 % sits in the middle
  const line = sparkline([{ t: at(0), memory_used_mib: agg(40), memory_total_mib: agg(80) }], "memory_pct", box);
  assert.deepEqual(line.segments, [[[0, 5]]]);
});
