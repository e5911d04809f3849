"""A card's ECC history reads at 1, 7 and 30 days, at 1280 and 800 px, in both languages: the chart keeps its
height and its labels a readable size whatever the period, and beside the hourly increases it states the
counter's absolute level (a card predicted at "uncorrectable total 103" shows 103, not only its increases)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from urllib.parse import unquote

import pytest

from tests.web.seed import Seeded
from tests.web.test_pages_browser import Open, _expect_timeout, loaded, open_page

pytestmark = pytest.mark.browser
__all__ = ["_expect_timeout", "open_page"]

LEVEL = {
    "en": re.compile(r"^Total \d[\d,]* at .+ \(\d[\d,]* at the start of the period\)$"),
    "zh": re.compile(r"^累计 \d"),
}


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("width", [1280, 800])
def test_the_chart_reads_at_every_period_with_its_absolute_level(
    open_page: Open, seeded: Seeded, width: int, lang: str
) -> None:
    from playwright.sync_api import expect

    node = seeded.nodes["gpu-a"]
    page = loaded(open_page(f"/nodes/gpu-health?card={node}:0", width=width, lang=lang))
    chart = page.locator('#ecc .chart[data-metric="ecc_corrected_total"]')
    for days in ("1", "7", "30"):
        page.select_option("#ecc-range", days)
        expect(chart.locator("svg rect.bar").first).to_be_attached()
        expect(chart.locator(".level")).to_have_text(LEVEL[lang])
        level = int(chart.locator(".level").get_attribute("data-level") or "-1")
        assert level > 0  # the degrading card's corrected total, not an increase
        svg = chart.locator("svg").bounding_box()
        assert svg is not None
        assert svg["height"] >= 100, (days, svg)
        tick = chart.locator(".tick-label").first.bounding_box()
        assert tick is not None
        assert tick["height"] >= 9, (days, tick)
        assert svg["width"] <= width  # never wider than the window


@pytest.fixture(scope="module")
def xid_on_gpu_a_1(seeded: Seeded) -> None:
    """An XID 79 on gpu-a's GPU 1, an hour ago (stored once however often it is inserted)."""
    from heteroflow.core.ids import NodeId
    from heteroflow.health.heartbeat import ParsedXid

    at = (seeded.now - timedelta(hours=1)).replace(microsecond=0)
    seeded.ctx.samples.insert_xid_events(
        [ParsedXid(gpu_index=1, uuid="SIM-healthy-0001", xid=79, occurred_at=at)],
        node_id=NodeId(seeded.nodes["gpu-a"]),
        source="real",
        received_at=at,
    )


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_xid_events_on_the_cards_view_and_the_nodes_and_a_type_ahead_picker(
    open_page: Open, seeded: Seeded, xid_on_gpu_a_1: None, lang: str
) -> None:
    from playwright.sync_api import expect

    node = seeded.nodes["gpu-a"]
    title = {"en": "XID events of this card in the period", "zh": "该卡在此期间的 XID 事件"}[lang]
    page = loaded(open_page(f"/nodes/gpu-health?card={node}:1", lang=lang))
    expect(page.locator("#xid-title")).to_have_text(title)
    expect(page.locator("#xid-table tbody tr")).to_have_count(1)
    expect(page.locator("#xid-table tbody tr").first).to_contain_text("XID 79")
    # another card: no event, and the page does not claim XIDs are collected when the node never said so
    page.select_option("#ecc-card", f"{node}|0")
    expect(page.locator("#card-xids")).to_have_attribute("data-collection", "unknown")
    expect(page.locator("#xid-empty")).to_be_visible()
    # the type-ahead: a typed card label selects it
    label = page.locator(f'#ecc-card option[value="{node}|1"]').text_content()
    assert label
    page.fill("#ecc-card-find", label)
    page.locator("#ecc-card-find").dispatch_event("change")
    expect(page.locator("#ecc-card")).to_have_value(f"{node}|1")
    expect(page.locator("#xid-table tbody tr")).to_have_count(1)

    nodes = open_page("/nodes", lang=lang)
    nodes.locator(f'#nodes-table tr[data-node="{node}"] .metrics-toggle').click()
    xids = nodes.locator(f'.node-xids[data-node="{node}"]')
    expect(xids.locator("tbody tr")).to_have_count(1)
    expect(xids.locator('tbody tr[data-gpu="1"]')).to_contain_text("XID 79")


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_nodes_metrics_history_reaches_back_over_the_servers_retention(
    open_page: Open, seeded: Seeded, lang: str
) -> None:
    """Utilisation, temperature and power are not only the last hour: a day, a week or the whole retention."""
    from playwright.sync_api import expect

    node = seeded.nodes["gpu-a"]
    retention = seeded.ctx.metrics_settings.retention_days
    page = open_page("/nodes", lang=lang)
    page.locator(f'#nodes-table tr[data-node="{node}"] .metrics-toggle').click()
    choice = page.locator(f"#metrics-range-{node}")
    expect(choice.locator(f'option[value="{retention * 24}"]')).to_have_count(1)  # the server's own retention
    expect(page.locator(f"label[for='metrics-range-{node}']")).to_have_text({"en": "Period", "zh": "时间范围"}[lang])

    def days_back(url: str) -> int:
        since = re.search(r"since=([^&]+)", url)
        if since is None:
            return -1
        return (seeded.now - datetime.fromisoformat(unquote(since.group(1)).replace("Z", "+00:00"))).days

    # the request the choice makes (not the first hour's, whose event may arrive late)
    with page.expect_request(lambda r: "/gpu-metrics" in r.url and days_back(r.url) > 1) as asked:
        choice.select_option(str(retention * 24))
    assert retention - 1 <= days_back(asked.value.url) <= retention
    # its answer is shown for that period (the sparklines, or the line saying there are none), whatever else the
    # row holds (the node's XID events, which another test may have added)
    expect(choice).to_have_value(str(retention * 24))
    expect(page.locator(f'tr[data-metrics-of="{node}"]').locator(".sparks, p.empty").first).to_be_visible()


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_at_800_px_no_column_of_the_predictions_or_the_matrix_is_clipped(
    open_page: Open, seeded: Seeded, lang: str
) -> None:
    from playwright.sync_api import expect

    page = loaded(open_page("/nodes/gpu-health", width=800, lang=lang))
    for table in ("#pred-table", "#caps-table"):
        clipped = page.locator(table).locator("xpath=..").evaluate("el => el.scrollWidth - el.clientWidth")
        assert clipped <= 0, f"{table} hides {clipped}px behind its scroll at 800 px"
    evidence = page.locator("#pred-table td.evidence").first
    expect(evidence).to_be_visible()
    box = evidence.bounding_box()
    assert box is not None
    assert box["x"] + box["width"] <= 800
    label = {"en": "Retired pages: ", "zh": "退役页: "}[lang]
    cell = page.locator('#caps-table td.metric[data-metric="retired_pages"]').first
    assert cell.evaluate("el => getComputedStyle(el, '::before').content") == f'"{label}"'
