"""At fleet scale (1,000 simulated cards) the GPU health page answers "which cards are predicted this week,
uncorrectable first?" by one filter (pending) and one sort (strong signals first), in English and in Chinese.
Timing is measured in bench/web_fleet.py, never asserted here."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.web.fleet_seed import Fleet, fleet_server
from tests.web.session import sign_in

pytestmark = pytest.mark.browser

PAGE = 50
TEXTS = {
    "en": {
        "page": "Page 1 of 3 · 125 predictions",
        "all": "1125 predictions",
        "caps": "1000 cards",
        "ue": "Uncorrectable ECC",
    },
    "zh": {"page": "第 1 / 3 页 · 共 125 条", "all": "共 1125 条", "caps": "共 1000 张卡", "ue": "不可纠正 ECC"},
}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    started = time.monotonic()
    with fleet_server(tmp_path_factory.mktemp("fleet")) as server:
        print(f"1,000-card fleet seeded in {time.monotonic() - started:.1f} s")
        yield server


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_predicted_this_week_uncorrectable_first_at_1000_cards(browser: Any, fleet: Fleet, lang: str) -> None:
    from playwright.sync_api import expect

    assert fleet.cards == 1000
    assert len(fleet.this_week) == 125
    assert fleet.strong == 25
    text = TEXTS[lang]
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.add_init_script(f"localStorage.setItem('heteroflow.lang', {json.dumps(lang)});")
    sign_in(context, fleet.base_url, fleet.reader)
    try:
        page = context.new_page()
        page.goto(fleet.base_url + "/nodes/gpu-health")
        expect(page.locator("#pred-pager")).to_contain_text(text["all"], timeout=20_000)
        expect(page.locator("#caps-pager")).to_contain_text(text["caps"], timeout=20_000)
        # one filter, one sort
        page.select_option("#pred-filter", "pending")
        page.select_option("#pred-sort", "strong_first")
        expect(page.locator("#pred-pager")).to_contain_text(text["page"])
        rows = page.locator("#pred-table tbody tr")
        expect(rows).to_have_count(PAGE)
        ids = [rows.nth(i).get_attribute("data-id") for i in range(PAGE)]
        assert ids == fleet.this_week[:PAGE]
        # the uncorrectable cards (strong: already failing) first, then the trends
        types = [rows.nth(i).locator(".badge.type").first.get_attribute("data-type") for i in range(PAGE)]
        assert types == ["uncorrectable_ecc"] * fleet.strong + ["corrected_ecc_growth"] * (PAGE - fleet.strong)
        expect(rows.first.locator(".badge.type")).to_have_text(text["ue"])
        expect(rows.first.locator(".badge.status-pending")).to_be_visible()
        # the answer is in the URL: reloading it is the same answer
        assert re.search(r"status=pending", page.url)
        assert re.search(r"sort=strong_first", page.url)
        page.reload()
        expect(page.locator("#pred-pager")).to_contain_text(text["page"])
        expect(page.locator("#pred-table tbody tr").first).to_have_attribute("data-id", fleet.this_week[0])
    finally:
        context.close()


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_every_card_with_an_unknown_counter_in_one_filter_and_its_export_at_1000_cards(
    browser: Any, fleet: Fleet, lang: str
) -> None:
    """The fleet's cards report neither retired pages nor pending or uncorrectable remaps: one filter lists all
    1,000 of them, the counts say so per counter, and the export holds every one of them (not one page)."""
    from playwright.sync_api import expect

    counts = {
        "en": ("Retired pages: 1,000 cards unknown", "0 cards", "1000 cards"),
        "zh": ("1,000 张卡未知", "共 0 张卡", "共 1000 张卡"),
    }[lang]
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    context.add_init_script(f"localStorage.setItem('heteroflow.lang', {json.dumps(lang)});")
    sign_in(context, fleet.base_url, fleet.reader)
    try:
        page = context.new_page()
        page.goto(fleet.base_url + "/nodes/gpu-health")
        expect(page.locator("#caps-pager")).to_contain_text(counts[2], timeout=20_000)
        page.select_option("#caps-unknown", "any")
        expect(page.locator("#caps-pager")).to_contain_text(counts[2])
        assert "cunknown=any" in page.url
        retired = page.locator('#caps-unknown-counts [data-metric="retired_pages"]')
        expect(retired).to_have_attribute("data-count", "1000")
        expect(retired).to_contain_text(counts[0])
        expect(page.locator('#caps-unknown-counts [data-metric="ecc_uncorrected_total"]')).to_have_attribute(
            "data-count", "0"
        )
        with page.expect_download() as info:
            page.click("#caps-export")
        lines = Path(info.value.path()).read_text(encoding="utf-8").splitlines()
        assert len(lines) == 1 + 1000
        assert lines[0].startswith("node_name,node_id,gpu_index,uuid,")
        assert all(",unknown," in line for line in lines[1:])
        page.select_option("#caps-unknown", "ecc_uncorrected_total")
        expect(page.locator("#caps-pager")).to_contain_text(counts[1])
        expect(page.locator("#caps-empty")).to_be_visible()
        page.reload()
        expect(page.locator("#caps-unknown")).to_have_value("ecc_uncorrected_total")
    finally:
        context.close()
