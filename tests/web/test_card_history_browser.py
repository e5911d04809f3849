"""A card's ECC history reads at 1, 7 and 30 days, at 1280 and 800 px, in both languages: the chart keeps its
height and its labels a readable size whatever the period, and beside the hourly increases it states the
counter's absolute level (a card predicted at "uncorrectable total 103" shows 103, not only its increases)."""

from __future__ import annotations

import re

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
