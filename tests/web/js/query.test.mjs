import { test } from "node:test";
import assert from "node:assert/strict";
import {
  CAPS_SORTS,
  DEFAULT_VIEW,
  SORTS,
  TYPES,
  capabilityExportHref,
  capabilityParams,
  CAPS_UNKNOWNS,
  parseCard,
  parseNodeLink,
  parseView,
  predictionParams,
  writeView,
} from "../../../src/heteroflow/platform_server/web/ui/logic/query.js";
import { LANGUAGES } from "../../../src/heteroflow/platform_server/web/ui/i18n.js";

test("the defaults read and write as an empty query", () => {
  assert.deepEqual(parseView(""), { ...DEFAULT_VIEW });
  assert.equal(writeView(DEFAULT_VIEW), "");
});

test("a view survives the round trip through its URL", () => {
  const view = {
    source: "simulated",
    status: "pending",
    type: "strong",
    sort: "strong_first",
    q: "gpu-a 01",
    page: 3,
    card: { node_id: "6f1c-node", gpu_index: 7 },
    refresh: true,
    range: 30,
    stalled: true,
    cq: "GPU-ab",
    cnode: "6f1c-node",
    cunknown: "retired_pages",
    csort: "stalled_first",
    cpage: 4,
  };
  assert.deepEqual(parseView(writeView(view)), view);
});

test("unknown or hostile values fall back to the defaults, never an error", () => {
  const view = parseView(
    "?status=dead&type=weak&sort=random&page=-2&card=nocolon&refresh=yes&source=all&range=2&csort=size&cpage=0&cunknown=temperature",
  );
  assert.deepEqual(view, { ...DEFAULT_VIEW });
  assert.equal(parseView("?page=99999999").page, 1);
  assert.equal(parseView(`?q=${"x".repeat(300)}`).q.length, 128);
  assert.equal(parseCard("n:4096"), null);
  assert.equal(parseCard(":1"), null);
  assert.deepEqual(parseCard("a:b:2"), { node_id: "a:b", gpu_index: 2 });
});

test("the serving dashboard's node link searches that node's cards", () => {
  assert.equal(parseView("?node=sim-local-01").q, "sim-local-01");
  assert.equal(parseView("?node=a&q=b").q, "b");
  assert.deepEqual(parseNodeLink("?node=sim-local-01&gpu=3"), { node: "sim-local-01", gpu: 3 });
  assert.equal(parseNodeLink("?node=sim-local-01"), null);
  assert.equal(parseNodeLink("?node=a&gpu=-1"), null);
  assert.equal(parseNodeLink("?node=a&gpu=x"), null);
  assert.equal(parseNodeLink("?gpu=1"), null);
});

test("API parameters carry only what is chosen; the page becomes an offset", () => {
  assert.deepEqual(predictionParams(DEFAULT_VIEW, 50), { source: "real", limit: 50, offset: 0 });
  const view = { ...DEFAULT_VIEW, status: "pending", type: "strong", sort: "strong_first", q: "gpu", page: 2 };
  assert.deepEqual(predictionParams(view, 50), {
    source: "real",
    limit: 50,
    offset: 50,
    status: "pending",
    type: "strong",
    sort: "strong_first",
    q: "gpu",
  });
});

test("every type and sort has its words in both languages", () => {
  for (const lang of ["en", "zh"]) {
    for (const type of TYPES) assert.ok(LANGUAGES[lang][`pred.type.${type}`], `${lang} type ${type}`);
    for (const sort of SORTS) assert.ok(LANGUAGES[lang][`pred.sort.${sort}`], `${lang} sort ${sort}`);
  }
});

test("the capability matrix's parameters: stalled only, node, search, order and page", () => {
  assert.deepEqual(capabilityParams(DEFAULT_VIEW, 50), { source: "real", limit: 50, offset: 0 });
  const view = { ...DEFAULT_VIEW, stalled: true, cnode: "n-1", cq: "GPU", csort: "stalled_first", cpage: 3 };
  assert.deepEqual(capabilityParams(view, 50), {
    source: "real",
    limit: 50,
    offset: 100,
    status: "stalled",
    node_id: "n-1",
    q: "GPU",
    sort: "stalled_first",
  });
  assert.deepEqual(CAPS_SORTS, ["node", "stalled_first", "recent_first"]);
  for (const sort of CAPS_SORTS) {
    assert.ok(LANGUAGES.en[`caps.sort.${sort}`], sort);
    assert.ok(LANGUAGES.zh[`caps.sort.${sort}`], sort);
  }
});

test("the capability matrix's unknown filter and its CSV export carry the same filters", () => {
  const view = { ...DEFAULT_VIEW, cunknown: "any", cnode: "n-1", cpage: 3 };
  assert.equal(capabilityParams(view, 50).unknown, "any");
  assert.equal(capabilityParams(DEFAULT_VIEW, 50).unknown, undefined);
  assert.equal(
    capabilityExportHref(view),
    "/api/v1/gpu-health/capabilities.csv?source=real&node_id=n-1&unknown=any",
  );
  for (const value of CAPS_UNKNOWNS) {
    if (value === "any") continue;
    assert.ok(LANGUAGES.en[`caps.metric.${value}`], value);
    assert.ok(LANGUAGES.zh[`caps.metric.${value}`], value);
  }
});
