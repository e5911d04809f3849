import { test } from "node:test";
import assert from "node:assert/strict";
import { RANGES, timeTicks } from "../../../src/heteroflow/platform_server/web/ui/logic/axis.js";

const T = Date.parse("2026-03-01T10:20:00Z");
const H = 3_600_000;

test("a day is labelled by hours, a week by days, a month every five days", () => {
  const day = timeTicks(T - 24 * H, T);
  assert.ok(day.length >= 6 && day.length <= 10, String(day.length));
  assert.match(day[0].label, /^\d\d:00$/);
  const week = timeTicks(T - 7 * 24 * H, T);
  assert.deepEqual(
    week.map((x) => x.label),
    ["02-23", "02-24", "02-25", "02-26", "02-27", "02-28", "03-01"],
  );
  const month = timeTicks(T - 30 * 24 * H, T);
  assert.ok(month.length >= 6 && month.length <= 10, String(month.length));
  assert.ok(month.every((x) => /^\d\d-\d\d$/.test(x.label)));
});

test("ticks lie inside the period, ascending, on whole hours", () => {
  for (const days of RANGES) {
    const from = T - days * 24 * H;
    const ticks = timeTicks(from, T);
    assert.ok(ticks.length > 0);
    for (const [i, tick] of ticks.entries()) {
      assert.ok(tick.at >= from && tick.at <= T);
      assert.equal(tick.at % H, 0);
      if (i > 0) assert.ok(tick.at > ticks[i - 1].at);
    }
  }
});

test("an empty or reversed period has no ticks", () => {
  assert.deepEqual(timeTicks(T, T), []);
  assert.deepEqual(timeTicks(T, T - H), []);
  assert.deepEqual(timeTicks(Number.NaN, T), []);
});
