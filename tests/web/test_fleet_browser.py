"""At fleet scale (1,000 simulated cards) the GPU health page answers "which cards are predicted this week,
uncorrectable first?" by one filter (pending) and one sort (strong signals first), in English and in Chinese.
Timing is measured in bench/web_fleet.py, never asserted here."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
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
