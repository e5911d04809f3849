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

test("the serving timeline's Chinese sentences name a pod 容器组 and a rank DP 副本, as the pods table and rank grid do", () => {
  const keys = Object.keys(LANGUAGES.zh).filter((k) => k.startsWith("serving.tl.") || k === "serving.rank_node_link");
  assert.ok(keys.length > 40, keys.length);
  for (const key of keys) {
    const words = LANGUAGES.zh[key].replace(/\{[a-z_]+\}/g, ""); // placeholders are not words
    assert.doesNotMatch(words, /\bpods?\b/i, `${key}: ${LANGUAGES.zh[key]}`);
    assert.doesNotMatch(words, /\branks?\b/i, `${key}: ${LANGUAGES.zh[key]}`);
  }
  // a sentence about a pod or a rank says so in the same words as the table and the grid
  for (const key of ["serving.tl.guard", "serving.tl.apply", "serving.tl.pod_stop", "serving.tl.finalize_commit"]) {
    assert.match(LANGUAGES.zh[key], /容器组 \{pod\}/, key);
  }
  for (const key of ["serving.tl.probe", "serving.tl.probe_bad", "serving.tl.evidence", "serving.rank_node_link"]) {
    assert.match(LANGUAGES.zh[key], /DP 副本 \{rank\}/, key);
  }
});
