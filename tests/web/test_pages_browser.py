# ruff: noqa: RUF001  # the pages are checked against their exact Chinese and typographic wording
"""The web pages in a real headless Chromium against a live, seeded server: one test per row of the seed's page
table (页面功能介绍), plus sign-in failure, tenant scope, source switching, resolving an alert and the language."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import httpx2 as httpx
import pytest

from heteroflow.core.ids import NodeId
from heteroflow.health.samples import CardKey
from heteroflow.http.tls import client_tls
from tests.web.seed import Seeded
from tests.web.session import sign_in

pytestmark = pytest.mark.browser

Open = Callable[..., Any]
UNKNOWN_IS_NEVER_ZERO = re.compile(r"\b0(\.0)?%")


@pytest.fixture(scope="module", autouse=True)
def _expect_timeout(browser: Any) -> None:
    """Once the browser fixture has found Playwright (or skipped, or failed in CI): a patient default timeout."""
    from playwright.sync_api import expect

    expect.set_options(timeout=15_000)


@pytest.fixture
def open_page(browser: Any, seeded: Seeded) -> Iterator[Open]:
    """Open a page in a fresh browser context (own cookies and storage), signed in with ``token`` unless None."""
    contexts: list[Any] = []
    errors: list[str] = []

    def opener(
        path: str,
        *,
        token: str | None = seeded.reader,
        lang: str | None = None,
        width: int = 1280,
        color_scheme: str = "light",
    ) -> Any:
        context = browser.new_context(
            viewport={"width": width, "height": 900}, color_scheme=color_scheme, accept_downloads=True
        )
        contexts.append(context)
        if token is not None:
            sign_in(context, seeded.base_url, token)
        if lang is not None:
            context.add_init_script(
                "if (!sessionStorage.getItem('seeded')) {"
                f" localStorage.setItem('heteroflow.lang', {json.dumps(lang)});"
                " sessionStorage.setItem('seeded', '1'); }"
            )
        page = context.new_page()
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        if path:
            page.goto(seeded.base_url + path)
        return page

    yield opener
    for context in contexts:
        context.close()
    assert not errors, f"uncaught page errors: {errors}"


def api(seeded: Seeded, path: str, token: str | None = None, **params: Any) -> Any:
    response = httpx.get(
        seeded.base_url + path,
        params=params,
        headers={"Authorization": f"Bearer {token or seeded.reader}"},
        verify=client_tls(),
    )
    response.raise_for_status()
    return response.json()


def loaded(page: Any) -> Any:
    """Wait until the four blocks of the GPU health page have their data."""
    from playwright.sync_api import expect

    expect(page.locator("#stats .stat-card")).to_have_count(2)
    expect(page.locator("#pred-pager")).to_be_visible()
    expect(page.locator("#caps-note")).to_be_visible()
    expect(page.locator("#ecc .chart").first).to_be_visible()
    return page


def select_card(page: Any, node: str, index: int) -> None:
    page.select_option("#ecc-card", value=f"{node}|{index}")


# ---- 常驻校准提示 ---------------------------------------------------------------------------------------------
def test_calibration_notice_uses_local_text_on_failure_and_the_disclaimer_verbatim(
    open_page: Open, seeded: Seeded
) -> None:
    from playwright.sync_api import expect

    # Before sign-in: the notice is there (it is part of the static shell).
    page = open_page("/nodes/gpu-health", token=None)
    expect(page.locator("#calibration")).to_be_visible()
    expect(page.locator("#calibration-heading")).to_have_text(
        "Initial empirical thresholds, pending calibration with real data."
    )
    # ... in the reader's language, heading and text, before any API call
    chinese = open_page("/nodes/gpu-health", token=None, lang="zh")
    expect(chinese.locator("#signin")).to_be_visible()
    expect(chinese.locator("#calibration-heading")).to_have_text("初始经验阈值，待真实数据校准。")
    expect(chinese.locator("#calibration-text")).to_contain_text("故障预测是实验性的")
    # The statistics call fails: the local fallback text stands in.
    failing = open_page("")
    failing.route("**/api/v1/gpu-health/prediction-stats*", lambda route: route.fulfill(status=503, body="{}"))
    failing.goto(seeded.base_url + "/nodes/gpu-health")
    expect(failing.locator("#stats .error")).to_be_visible()
    expect(failing.locator("#calibration")).to_be_visible()
    expect(failing.locator("#calibration-text")).to_have_attribute("data-origin", "fallback")
    expect(failing.locator("#calibration-text")).to_contain_text("experimental")
    # The call succeeds: the API's disclaimer verbatim.
    disclaimer = api(seeded, "/api/v1/gpu-health/prediction-stats")["disclaimer"]
    ok = loaded(open_page("/nodes/gpu-health"))
    expect(ok.locator("#calibration-text")).to_have_text(disclaimer)
    expect(ok.locator("#calibration-text")).to_have_attribute("data-origin", "api")


def test_sign_in_failure_then_success(open_page: Open, seeded: Seeded) -> None:
    from playwright.sync_api import expect

    page = open_page("/nodes/gpu-health", token=None)
    # the form says where tokens come from, and nothing of sessionStorage
    expect(page.locator("#signin-where code")).to_have_text(
        "heteroflow admin create-token --scopes nodes:read --name <your-name>"
    )
    expect(page.locator("#signin")).not_to_contain_text("sessionStorage")
    page.fill("#token", "hf_not-a-real-token")
    page.click("#signin-submit")
    expect(page.locator("#signin-message")).to_contain_text("401")
    expect(page.locator("#stats")).to_have_count(0)
    page.fill("#token", seeded.reader)
    page.keyboard.press("Enter")
    loaded(page)
    assert_token_unreadable(page, seeded.reader)
    page.click("#signout")
    expect(page.locator("#signin")).to_be_visible()
    assert not [c for c in page.context.cookies() if c["name"] == "heteroflow_session"]
    page.reload()  # the server ended the session: the form again, not the page
    expect(page.locator("#signin")).to_be_visible()


def assert_token_unreadable(page: Any, token: str) -> None:
    """Neither the token nor the session secret is readable by the page's scripts."""
    (cookie,) = [c for c in page.context.cookies() if c["name"] == "heteroflow_session"]
    assert cookie["httpOnly"] is True
    assert cookie["sameSite"] == "Strict"
    assert cookie["path"] == "/"
    readable = page.evaluate(
        "JSON.stringify([document.cookie, Object.entries(sessionStorage), Object.entries(localStorage)])"
    )
    assert cookie["value"] not in readable
    assert token not in readable
    assert "heteroflow_session" not in readable


def test_one_sign_in_serves_every_tab_and_sign_out_ends_it_for_all(open_page: Open, seeded: Seeded) -> None:
    from playwright.sync_api import expect

    first = open_page("/nodes/gpu-health", token=None)
    first.fill("#token", seeded.reader)
    first.click("#signin-submit")
    loaded(first)
    assert_token_unreadable(first, seeded.reader)
    # a second tab of the same browser: signed in, no form
    second = first.context.new_page()
    second.goto(seeded.base_url + "/alerts")
    expect(second.locator("#alerts-title")).to_be_visible()
    expect(second.locator("#signin")).to_have_count(0)
    assert_token_unreadable(second, seeded.reader)
    # signing out in the second tab ends the session on the server: the first tab's next call is refused
    second.click("#signout")
    expect(second.locator("#signin")).to_be_visible()
    first.goto(seeded.base_url + "/alerts")
    expect(first.locator("#signin")).to_be_visible()
    expect(first.locator("#signin-title")).to_have_text("Sign in")


# ---- 数据来源切换 ---------------------------------------------------------------------------------------------
def test_source_switch_clears_every_block_and_discards_late_responses(open_page: Open, seeded: Seeded) -> None:
    from playwright.sync_api import expect

    held: list[Any] = []
    holding = {"real-stats": False, "simulated": True}

    def hold(route: Any) -> None:
        url = route.request.url
        kind = "simulated" if "source=simulated" in url else "real-stats" if "prediction-stats" in url else None
        if kind and holding[kind]:
            held.append(route)
        else:
            route.continue_()

    page = open_page("")
    # Hold every simulated request, and later a real statistics response, until we release them.
    page.route("**/api/v1/gpu-health/**", hold)
    page.goto(seeded.base_url + "/nodes/gpu-health")
    expect(page.locator("#pred-table")).to_be_visible()
    expect(page.locator("#ecc .chart").first).to_be_visible()
    assert page.locator("#ecc-card").input_value() != ""
    expect(page.locator("#sim-banner")).to_be_hidden()

    page.click("#source-simulated")
    # Everything from the real source is gone before any simulated data arrives.
    expect(page.locator("#sim-banner")).to_be_visible()
    expect(page.locator("#pred-table")).to_have_count(0)
    expect(page.locator("#caps-table")).to_have_count(0)
    expect(page.locator("#ecc-card")).to_have_count(0)
    expect(page.locator("#ecc .chart")).to_have_count(0)
    for block in ("#stats", "#predictions", "#ecc", "#capabilities"):
        expect(page.locator(block)).to_contain_text("Loading")
        expect(page.locator(f"{block} .badge.sim")).to_be_visible()
    assert page.url.endswith("?source=simulated")

    holding["simulated"] = False
    for route in list(held):
        route.continue_()
    held.clear()
    sim = api(seeded, "/api/v1/gpu-health/prediction-stats", source="simulated")
    expect(page.locator('#stats [data-band="7"] [data-key="pending"]')).to_have_text(str(sim["windows"][0]["pending"]))
    expect(page.locator('#stats [data-band="7"]')).to_have_attribute("data-state", "insufficient")
    expect(page.locator("#caps-table")).to_contain_text("sim-demo")
    expect(page.locator("#caps-table")).not_to_contain_text("gpu-a")
    expect(page.locator("#pred-table")).to_contain_text("sim-demo")

    # Back to real, holding its statistics; switch to simulated again and only then let the real answer arrive:
    # it is discarded, never shown under the simulated banner.
    holding["real-stats"] = True
    page.click("#source-real")
    expect(page.locator("#sim-banner")).to_be_hidden()
    expect(page.locator("#caps-table")).to_contain_text("gpu-a")
    expect(page.locator("#caps-table")).not_to_contain_text("sim-demo")
    expect(page.locator("#stats")).to_contain_text("Loading")
    assert len(held) == 1
    page.click("#source-simulated")
    expect(page.locator('#stats [data-band="7"] [data-key="pending"]')).to_have_text(str(sim["windows"][0]["pending"]))
    late = held.pop()
    late.continue_()
    page.wait_for_timeout(300)
    expect(page.locator('#stats [data-band="7"] [data-key="pending"]')).to_have_text(str(sim["windows"][0]["pending"]))
    expect(page.locator("#sim-banner")).to_be_visible()


# ---- 统计卡 ---------------------------------------------------------------------------------------------------
def test_stats_cards_show_ratios_only_when_sufficient_and_raw_counts_always(open_page: Open, seeded: Seeded) -> None:
    from playwright.sync_api import expect

    stats = api(seeded, "/api/v1/gpu-health/prediction-stats")
    seven, thirty = sorted(stats["windows"], key=lambda b: b["window_days"])
    page = loaded(open_page("/nodes/gpu-health"))
    card7, card30 = page.locator('#stats [data-band="7"]'), page.locator('#stats [data-band="30"]')
    expect(card7).to_have_attribute("data-state", "sufficient")
    expect(card7.locator('[data-key="precision"]')).to_have_text(f"{seven['precision'] * 100:.1f}%")
    # No failed card: the recall is unknown, said in words — never 0%.
    expect(card7.locator('[data-key="recall"]')).to_contain_text("Unknown")
    expect(card30).to_have_attribute("data-state", "insufficient")
    expect(card30.locator(".insufficient")).to_contain_text("Not enough samples for a hit rate yet")
    expect(card30.locator(".insufficient li")).to_have_text(
        [f"{thirty['matured']} of ≥ 20 matured predictions (hit + miss; voided excluded)"]
    )
    expect(card30.locator('[data-key="precision"]')).to_have_count(0)
    for card, band in ((card7, seven), (card30, thirty)):
        for key in ("pending", "hit", "miss", "voided", "failed_cards", "predicted_cards", "missed_cards"):
            expect(card.locator(f'[data-key="{key}"]')).to_have_text(str(band[key]))
        expect(card.locator('[data-key="monitorable_cards"]')).to_have_text(str(stats["monitorable_cards"]))
        expect(card.locator('[data-key="span_days"]')).to_contain_text("days")
        # first failures: their own counts, their own gate
        first = band["first_failure"]
        expect(card.locator('[data-part="first_failure"]')).to_contain_text("First failures")
        expect(card.locator('[data-key="first_failure_failed_cards"]')).to_have_text(str(first["failed_cards"]))
        if first["precision"] is None:
            expect(card.locator('[data-key="first_failure_precision"]')).to_have_text("not enough samples")
    assert not UNKNOWN_IS_NEVER_ZERO.search(page.locator("#stats").inner_text())


def test_stats_card_gate_is_checked_by_the_page_itself(open_page: Open, seeded: Seeded) -> None:
    from playwright.sync_api import expect

    body = api(seeded, "/api/v1/gpu-health/prediction-stats")
    for band in body["windows"]:  # a server that (wrongly) sends ratios on 19 matured predictions
        band.update(hit=10, miss=9, matured=19, precision=0.5, recall=0.0, insufficient=[])
    page = open_page("")
    page.route("**/api/v1/gpu-health/prediction-stats*", lambda route: route.fulfill(json=body))
    page.goto(seeded.base_url + "/nodes/gpu-health")
    expect(page.locator('#stats [data-state="insufficient"]')).to_have_count(2)
    expect(page.locator("#stats")).not_to_contain_text("50.0%")
    expect(page.locator("#stats")).not_to_contain_text("0.0%")
    expect(page.locator('#stats [data-band="7"] li')).to_have_text(
        ["19 of ≥ 20 matured predictions (hit + miss; voided excluded)"]
    )


# ---- 预测列表 -------------------------------------------------------------------------------------------------
def test_prediction_list_filter_returns_to_page_one(open_page: Open, seeded: Seeded) -> None:
    from playwright.sync_api import expect

    total = api(seeded, "/api/v1/gpu-health/predictions", limit=1)["total"]
    pending = api(seeded, "/api/v1/gpu-health/predictions", limit=1, status="pending")["total"]
    hits = api(seeded, "/api/v1/gpu-health/predictions", limit=1, status="hit")["total"]
    assert total > 50
    assert hits < 50
    page = loaded(open_page("/nodes/gpu-health"))
    page.click("#pred-next")
    expect(page.locator("#pred-page")).to_have_text(f"Page 2 of 2 · {total} predictions")
    page.select_option("#pred-filter", "pending")
    expect(page.locator("#pred-pager")).to_have_text(f"{pending} predictions")
    expect(page.locator("#pred-table tbody tr")).to_have_count(pending)
    page.select_option("#pred-filter", "all")
    expect(page.locator("#pred-page")).to_have_text(f"Page 1 of 2 · {total} predictions")
    page.click("#pred-next")
    expect(page.locator("#pred-page")).to_have_text(f"Page 2 of 2 · {total} predictions")
    page.select_option("#pred-filter", "hit")
    # Under one page: only the total, no page buttons.
    expect(page.locator("#pred-pager")).to_have_text(f"{hits} predictions")
    expect(page.locator("#pred-next")).to_have_count(0)
    expect(page.locator("#pred-table tbody tr")).to_have_count(hits)
    for badge in page.locator("#pred-table tbody .badge.status-hit").all():
        expect(badge).to_have_text("Hit")
    expect(page.locator("#pred-table .badge[class*='status-']:not(.status-hit)")).to_have_count(0)


def test_prediction_list_pages_by_fifty_with_honest_totals(open_page: Open, seeded: Seeded) -> None:
    from playwright.sync_api import expect

    total = api(seeded, "/api/v1/gpu-health/predictions", limit=1)["total"]
    requests: list[str] = []
    page = open_page("")
    page.on("request", lambda r: requests.append(r.url) if "/gpu-health/predictions" in r.url else None)
    page.goto(seeded.base_url + "/nodes/gpu-health")
    loaded(page)
    expect(page.locator("#pred-page")).to_have_text(f"Page 1 of 2 · {total} predictions")
    expect(page.locator("#pred-table tbody tr")).to_have_count(50)
    expect(page.locator("#pred-prev")).to_be_disabled()
    page.click("#pred-next")
    expect(page.locator("#pred-table tbody tr")).to_have_count(total - 50)
    expect(page.locator("#pred-next")).to_be_disabled()
    page.click("#pred-prev")
    expect(page.locator("#pred-page")).to_have_text(f"Page 1 of 2 · {total} predictions")
    assert [re.search(r"offset=(\d+)", u).group(1) for u in requests] == ["0", "50", "0"]  # type: ignore[union-attr]
    assert all("limit=50" in u for u in requests)


def test_prediction_table_labels_from_evidence_and_row_selects_the_card(open_page: Open, seeded: Seeded) -> None:
    from playwright.sync_api import expect

    page = loaded(open_page("/nodes/gpu-health"))
    rows = page.locator("#pred-table tbody tr")
    unrecognised = rows.filter(has_text="operator note: investigate the card").first
    expect(unrecognised.locator(".badge.type")).to_have_text(["Unrecognised"])
    weak = rows.filter(has_text="weak signal [temperature_high]").first
    # The weak line mentions remap_failure: it must not add that label.
    expect(weak.locator(".badge.type")).to_have_text(["Retired pages growing"])
    strong = rows.filter(has_text="strong signal [uncorrectable_ecc]").first
    expect(strong.locator(".badge.type")).to_have_text(["Uncorrectable ECC"])
    old_rule = rows.filter(has_text="v0-initial").first
    expect(old_rule).to_contain_text("older than the current rule v1-ecc-growth")
    expect(rows.first.locator("td").first).to_contain_text("gpu-a #")
    # Row click (and Enter on a focused row) selects that card in the ECC rate block.
    target = rows.filter(has_text="gpu-a #2").first
    target.click()
    expect(page.locator("#ecc-card")).to_have_value(f"{seeded.nodes['gpu-a']}|2")
    expect(page.locator("#pred-table tr.selected").first).to_contain_text("gpu-a #2")
    other = rows.filter(has_text="gpu-a #1").first
    other.focus()
    page.keyboard.press("Enter")
    expect(page.locator("#ecc-card")).to_have_value(f"{seeded.nodes['gpu-a']}|1")
    expect(page.locator("#ecc-card")).to_be_focused()  # keyboard users land next to the chart they asked for


def test_prediction_list_empty_state_points_to_the_capability_matrix(open_page: Open, seeded: Seeded) -> None:
    from playwright.sync_api import expect

    page = open_page("/nodes/gpu-health", token=seeded.empty_reader)
    empty = page.locator("#pred-empty")
    expect(empty).to_contain_text(
        "That does not mean every card is healthy — cards without collection capability are never predicted."
    )
    expect(empty.locator('a[href="#capabilities"]')).to_be_visible()
    expect(page.locator("#pred-pager")).to_have_text("0 predictions")


# ---- ECC 速率 -------------------------------------------------------------------------------------------------
def test_ecc_selector_defaults_to_the_first_card_with_ecc_counts(open_page: Open, seeded: Seeded) -> None:
    from playwright.sync_api import expect

    page = loaded(open_page("/nodes/gpu-health"))
    expect(page.locator("#ecc-card")).to_have_value(f"{seeded.nodes['gpu-a']}|0")
    corrected = page.locator('#ecc .chart[data-metric="ecc_corrected_total"]')
    expect(corrected.locator("svg rect.bar").first).to_be_attached()
    expect(page.locator('#ecc .chart[data-metric="ecc_uncorrected_total"]')).to_be_visible()


def test_ecc_unknown_hours_are_shaded_labelled_and_never_zero(open_page: Open, seeded: Seeded) -> None:
    from playwright.sync_api import expect

    page = loaded(open_page("/nodes/gpu-health"))
    select_card(page, seeded.nodes["gpu-a"], 2)
    corrected = page.locator('#ecc .chart[data-metric="ecc_corrected_total"]')
    expect(corrected.locator("rect.bar-unknown[data-reason='card_swap']")).to_have_count(1)
    reasons = set(corrected.locator("rect.bar-unknown").evaluate_all("els => els.map(e => e.dataset.reason)"))
    assert {"no_sample", "stale", "decrease", "card_swap"} <= reasons
    assert corrected.locator("rect.bar-unknown").first.get_attribute("fill", timeout=1000).startswith("url(#")
    expect(corrected.locator("text.unknown-label").first).to_have_text("unknown")
    values = corrected.locator("rect.bar").evaluate_all("els => els.map(e => Number(e.dataset.value))")
    assert values
    # One error every 5 minutes: 12 an hour, except an hour whose end still reads the last sample before the gap
    # (at most the stall threshold old, so a known value): that hour is a true 0, not an unknown.
    assert all(0 <= v <= 12 for v in values)
    assert values.count(12) >= len(values) - 2
    known, total = int(corrected.get_attribute("data-computable") or 0), int(corrected.get_attribute("data-total") or 0)
    expect(corrected.locator(".coverage")).to_have_text(
        re.compile(rf"^Computable hours {known} / {total} · total increase \d+")
    )
    assert known == len(values)
    assert 0 < known < total
    # Uncorrectable ECC stayed 0: known zero hours are drawn as zero, unknown ones stay shaded.
    uncorrected = page.locator('#ecc .chart[data-metric="ecc_uncorrected_total"]')
    expect(uncorrected.locator("rect.bar-zero").first).to_be_attached()
    expect(uncorrected.locator(".coverage")).to_contain_text("total increase 0")


def test_ecc_whole_metric_unknown_shows_a_big_unknown(open_page: Open, seeded: Seeded) -> None:
    from playwright.sync_api import expect

    page = loaded(open_page("/nodes/gpu-health"))
    select_card(page, seeded.nodes["gpu-a"], 3)  # reports uncorrectable ECC only
    corrected = page.locator('#ecc .chart[data-metric="ecc_corrected_total"]')
    expect(corrected).to_have_attribute("data-state", "unknown")
    expect(corrected.locator(".big-unknown")).to_have_text("Unknown")
    expect(corrected).to_contain_text("that is not zero errors")
    expect(page.locator('#ecc .chart[data-metric="ecc_uncorrected_total"]')).to_have_attribute("data-state", "known")


def test_ecc_truncation_warning_and_not_loaded_hours(open_page: Open, seeded: Seeded) -> None:
    from playwright.sync_api import expect

    page = loaded(open_page("/nodes/gpu-health"))
    select_card(page, seeded.nodes["gpu-big"], 0)
    expect(page.locator("#ecc-truncated")).to_have_text(
        "Sample limit reached: only the most recent 20000 samples are included; earlier ones were not loaded."
    )
    corrected = page.locator('#ecc .chart[data-metric="ecc_corrected_total"]')
    expect(corrected.locator("rect.bar-unknown[data-reason='not_loaded']").first).to_be_attached()
    select_card(page, seeded.nodes["gpu-a"], 0)
    expect(page.locator("#ecc-truncated")).to_have_count(0)


# ---- 能力矩阵 -------------------------------------------------------------------------------------------------
def test_capability_matrix_columns_metrics_vendor_and_footer(open_page: Open, seeded: Seeded) -> None:
    from playwright.sync_api import expect

    caps = api(seeded, "/api/v1/gpu-health/capabilities")
    page = loaded(open_page("/nodes/gpu-health"))
    table = page.locator("#caps-table")
    expect(table.locator("thead th")).to_have_text(
        [
            "Card",
            "Node vendor / model",
            "Corrected ECC",
            "Uncorrectable ECC",
            "Retired pages",
            "Pending remaps",
            "Remap failures",
            "Uncorrectable remaps",
            "Trend prediction",
            "Last sample · count",
        ]
    )
    stalled_card = table.locator(f'tr[data-node="{seeded.nodes["gpu-a"]}"][data-index="3"]')
    expect(stalled_card.locator("td.metric")).to_have_text(
        ["Unknown", "Collectable", "Unknown", "Unknown", "Unknown", "Unknown"]
    )
    expect(stalled_card).to_contain_text("Not possible")
    expect(stalled_card).to_contain_text("95 samples")
    # Vendor and model once per node, never per card.
    expect(table.locator("td.vendor")).to_have_count(3)
    expect(table.locator("td.vendor").filter(has_text="kunlunxin / P800")).to_have_count(1)
    expect(page.locator("#caps-note")).to_have_text(caps["note"])
    assert "Unsupported" not in table.inner_text()


def test_capability_matrix_stalled_badge(open_page: Open, seeded: Seeded) -> None:
    from playwright.sync_api import expect

    page = loaded(open_page("/nodes/gpu-health"))
    stalled = page.locator('#caps-table tr[data-stalled="true"]')
    # The card that stopped 3 hours ago and the swapped-out card of slot 2.
    expect(stalled).to_have_count(2)
    expect(stalled.locator(".badge.stalled")).to_have_text(["Collection stalled", "Collection stalled"])
    expect(stalled.locator(".badge.stalled").first).to_have_attribute("title", re.compile("60 minutes"))
    fresh = page.locator(f'#caps-table tr[data-node="{seeded.nodes["gpu-a"]}"][data-index="0"]')
    expect(fresh.locator(".badge.stalled")).to_have_count(0)


def test_capability_matrix_more_cards_rows(open_page: Open, seeded: Seeded) -> None:
    from playwright.sync_api import expect

    page = loaded(open_page("/nodes/gpu-health"))
    more = page.locator("#caps-table tr.more-cards")
    # gpu-a reports 8 GPUs with 4 sampled slots; gpu-b reports 2 and has no sample at all; gpu-big is complete.
    expect(more).to_have_count(2)
    expect(page.locator(f'tr.more-cards[data-node="{seeded.nodes["gpu-a"]}"]')).to_contain_text(
        "4 more cards, all metrics unknown"
    )
    expect(page.locator(f'tr.more-cards[data-node="{seeded.nodes["gpu-b"]}"]')).to_contain_text(
        "2 more cards, all metrics unknown"
    )


def test_no_auto_refresh(open_page: Open, seeded: Seeded) -> None:
    requests: list[str] = []
    page = open_page("")
    page.clock.install()
    page.on("request", lambda r: requests.append(r.url) if "/api/" in r.url else None)
    page.goto(seeded.base_url + "/nodes/gpu-health")
    loaded(page)
    before = len(requests)
    page.clock.run_for("30:00")
    page.wait_for_timeout(200)
    assert len(requests) == before


def test_auto_refresh_is_opt_in_and_kept_in_the_url(open_page: Open, seeded: Seeded) -> None:
    from playwright.sync_api import expect

    requests: list[str] = []
    page = open_page("")
    page.clock.install()
    page.on("request", lambda r: requests.append(r.url) if "/gpu-health/predictions" in r.url else None)
    page.goto(seeded.base_url + "/nodes/gpu-health")
    loaded(page)
    expect(page.locator("#as-of-time")).to_contain_text("Data as of")
    expect(page.locator("#auto-refresh")).not_to_be_checked()
    page.check("#auto-refresh")
    assert "refresh=1" in page.url
    before = len(requests)
    page.clock.run_for("01:01")
    deadline = 50
    while len(requests) == before and deadline:
        page.wait_for_timeout(100)
        deadline -= 1
    assert len(requests) == before + 1  # one refresh a minute, once asked for
    expect(page.locator("#pred-table tbody tr").first).to_be_visible()  # the rows stay on screen


def test_filters_sort_search_and_the_card_are_in_the_url(open_page: Open, seeded: Seeded) -> None:
    from playwright.sync_api import expect

    params = {"status": "pending", "type": "trend", "sort": "window_end"}
    expected = api(seeded, "/api/v1/gpu-health/predictions", limit=50, **params)
    assert expected["total"] > 0
    page = loaded(open_page("/nodes/gpu-health?status=pending&type=trend&sort=window_end"))
    expect(page.locator("#pred-filter")).to_have_value("pending")
    expect(page.locator("#pred-type")).to_have_value("trend")
    expect(page.locator("#pred-sort")).to_have_value("window_end")
    ids = page.locator("#pred-table tbody tr").evaluate_all("rows => rows.map(r => r.dataset.id)")
    assert ids == [item["id"] for item in expected["items"]]
    # a row picked: its card is in the URL, and a reload (or a link) brings it back
    first = expected["items"][0]
    page.locator(f'#pred-table tr[data-id="{first["id"]}"]').click()
    expect(page.locator("#ecc-card")).to_have_value(f"{first['node_id']}|{first['gpu_index']}")
    assert f"card={first['node_id']}%3A{first['gpu_index']}" in page.url
    page.reload()
    loaded(page)
    expect(page.locator("#ecc-card")).to_have_value(f"{first['node_id']}|{first['gpu_index']}")
    expect(page.locator("#pred-type")).to_have_value("trend")
    # the card search, server-side
    uuid = first["uuid"]
    page.fill("#pred-search", uuid)
    page.click("#pred-search-go")
    found = api(seeded, "/api/v1/gpu-health/predictions", limit=50, q=uuid, **params)
    expect(page.locator("#pred-table tbody tr")).to_have_count(len(found["items"]))
    assert "q=" in page.url
    page.fill("#pred-search", "no-such-card-anywhere")
    page.click("#pred-search-go")
    expect(page.locator("#pred-empty-filtered")).to_be_visible()


def test_ecc_chart_has_a_labelled_time_axis_and_three_ranges(open_page: Open, seeded: Seeded) -> None:
    from playwright.sync_api import expect

    requests: list[str] = []
    page = open_page("")
    page.on("request", lambda r: requests.append(r.url) if "/gpu-health/samples" in r.url else None)
    page.goto(seeded.base_url + "/nodes/gpu-health")
    loaded(page)
    chart = page.locator("#ecc .chart[data-state='known']").first
    expect(chart.locator(".tick-label").first).to_be_attached()
    labels = chart.locator(".tick-label").all_text_contents()
    assert 6 <= len(labels) <= 10, labels
    assert all(re.fullmatch(r"\d\d-\d\d", label) for label in labels), labels  # a week: one label a day
    expect(page.locator("#ecc-range")).to_have_value("7")
    page.select_option("#ecc-range", "1")
    expect(chart.locator(".tick-label").first).to_have_text(re.compile(r"^\d\d:00$"))  # a day: hours
    assert "range=1" in page.url
    page.select_option("#ecc-range", "30")
    expect(chart.locator(".tick-label").first).to_have_text(re.compile(r"^\d\d-\d\d$"))
    since = [re.search(r"since=([^&]+)", url) for url in requests]
    assert len(since) == 3, requests
    assert all(since), requests
    spans = [
        (datetime.now(UTC) - datetime.fromisoformat(unquote(m.group(1)).replace("Z", "+00:00"))).total_seconds() / 86400
        for m in since
        if m
    ]
    assert [round(span) for span in spans] == [7, 1, 30]
    page.reload()
    loaded(page)
    expect(page.locator("#ecc-range")).to_have_value("30")


def test_capability_matrix_stalled_only_is_served_by_the_api_and_in_the_url(open_page: Open, seeded: Seeded) -> None:
    from playwright.sync_api import expect

    stalled = api(seeded, "/api/v1/gpu-health/capabilities", stalled="true")["cards"]
    assert stalled
    assert all(card["collection_stalled"] for card in stalled)
    page = loaded(open_page("/nodes/gpu-health"))
    page.check("#caps-stalled")
    assert "stalled=1" in page.url
    rows = page.locator("#caps-table tbody tr")
    expect(rows).to_have_count(len(stalled))
    expect(page.locator("#caps-table tbody tr[data-stalled='false']")).to_have_count(0)
    expect(page.locator("#caps-table tr.more-cards")).to_have_count(0)
    page.reload()
    loaded(page)
    expect(page.locator("#caps-stalled")).to_be_checked()
    expect(rows).to_have_count(len(stalled))
    page.uncheck("#caps-stalled")
    expect(page.locator("#caps-table tr.more-cards").first).to_be_visible()


def test_the_csv_export_has_the_filtered_predictions(open_page: Open, seeded: Seeded) -> None:
    from playwright.sync_api import expect

    total = api(seeded, "/api/v1/gpu-health/predictions", limit=1, status="pending")["total"]
    page = loaded(open_page("/nodes/gpu-health?status=pending"))
    expect(page.locator("#pred-filter")).to_have_value("pending")
    with page.expect_download() as info:
        page.click("#pred-csv")
    download = info.value
    assert download.suggested_filename == "heteroflow-predictions-real.csv"
    lines = Path(download.path()).read_text().splitlines()
    assert lines[0].startswith("id,node_id,node_name,gpu_index,uuid")
    assert len(lines) == total + 1
    assert all(",pending," in line for line in lines[1:])


# ---- tenants, nodes, alerts -----------------------------------------------------------------------------------
def test_tenant_scope_on_every_page(open_page: Open, seeded: Seeded) -> None:
    from playwright.sync_api import expect

    page = loaded(open_page("/nodes/gpu-health"))
    expect(page.locator("#caps-table")).not_to_contain_text("gpu-other")
    expect(page.locator("#pred-table")).not_to_contain_text("gpu-other")
    nodes = open_page("/nodes")
    expect(nodes.locator("#nodes-table")).to_contain_text("gpu-a")
    expect(nodes.locator("#nodes-table")).not_to_contain_text("gpu-other")
    other = open_page("/nodes/gpu-health", token=seeded.other_reader)
    expect(other.locator("#caps-table")).to_contain_text("gpu-other")
    expect(other.locator("#caps-table")).not_to_contain_text("gpu-a")
    expect(other.locator("#pred-table")).to_contain_text("gpu-other")
    other_alerts = open_page("/alerts", token=seeded.other_reader)
    expect(other_alerts.locator("#alerts-table")).to_contain_text("gpu-other")
    expect(other_alerts.locator("#alerts-table")).not_to_contain_text("gpu-b")


def test_nodes_page_lists_online_state_and_gpu_counts(open_page: Open, seeded: Seeded) -> None:
    from playwright.sync_api import expect

    seeded.beat("gpu-a")
    page = open_page("/nodes")
    a = page.locator(f'#nodes-table tr[data-node="{seeded.nodes["gpu-a"]}"]')
    expect(a).to_have_attribute("data-online", "true")
    expect(a.locator(".badge.online")).to_have_text("Online")
    expect(a.locator("td.num")).to_have_text("8")
    b = page.locator(f'#nodes-table tr[data-node="{seeded.nodes["gpu-b"]}"]')
    expect(b.locator(".badge.offline")).to_have_text("Offline")
    expect(b).to_contain_text("never")
    sim = page.locator(f'#nodes-table tr[data-node="{seeded.nodes["sim-demo"]}"]')
    expect(sim.locator(".badge.sim")).to_have_text("Simulated")
    expect(page.locator("#nodes-total")).to_have_text("4 of 4 nodes")


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_nodes_page_shows_credential_card_bounds_and_tool_stalls(open_page: Open, seeded: Seeded, lang: str) -> None:
    from playwright.sync_api import expect

    # gpu-a beats naming a stalled vendor tool; the server keeps that word for the node
    response = httpx.post(
        f"{seeded.base_url}/api/v1/nodes/{seeded.nodes['gpu-a']}/heartbeat",
        json={"gpu_stats": [], "tool_stalls": [{"tool": "nvidia-smi", "since": "2026-01-02T03:04:00Z", "timeouts": 3}]},
        headers={"Authorization": f"Bearer {seeded.agent}"},
        verify=client_tls(),
    )
    response.raise_for_status()
    listed = httpx.get(
        f"{seeded.base_url}/api/v1/nodes",
        headers={"Authorization": f"Bearer {seeded.reader}"},
        verify=client_tls(),
    ).json()["items"]
    api_a = next(n for n in listed if n["id"] == seeded.nodes["gpu-a"])
    page = open_page("/nodes", lang=lang, width=800)
    facts = page.locator(f'#nodes-table tr[data-facts-of="{seeded.nodes["gpu-a"]}"]')
    words = {
        "en": (
            "Credential",
            "none (registered before node credentials)",
            "8 registered",
            "Refused",
            "nvidia-smi since 2026-01-02 03:04 UTC (3 timeouts)",
        ),
        "zh": (
            "节点凭据",
            "无（在节点凭据启用前注册）",
            "登记 8 张",
            "已拒绝",
            "nvidia-smi 自 2026-01-02 03:04 UTC 起（超时 3 次）",
        ),
    }[lang]
    cred = facts.locator('li[data-fact="credential"]')
    expect(cred).to_contain_text(words[0])
    # the seed registers its nodes without a credential: the API says none, and so does the page
    assert api_a["credential"]["state"] == "none"
    expect(cred.locator(".cred-state")).to_have_attribute("data-state", "none")
    expect(cred).to_contain_text(words[1])
    cards = api_a["cards"]
    expect(facts.locator('li[data-fact="cards"]')).to_contain_text(words[2])
    expect(facts.locator('li[data-fact="cards"]')).to_contain_text(str(cards["known_cards"]))
    hour = facts.locator('li[data-fact="hour"]')
    expect(hour).to_contain_text(f"{cards['new_cards_this_hour']:,} / {cards['new_cards_per_hour']:,}")
    expect(hour).to_contain_text(f"{cards['xid_events_this_hour']:,} / {cards['xid_events_per_hour']:,}")
    refused = facts.locator('li[data-fact="refused"]')
    expect(refused).to_contain_text(words[3])
    total = cards["refused_index_total"] + cards["refused_new_card_total"] + cards["refused_xid_total"]
    expect(refused).to_have_attribute("data-refused", str(total))
    expect(facts.locator('li[data-fact="tool-stalls"] .badge.stalled[data-tool="nvidia-smi"]')).to_have_text(words[4])
    # a node whose last beat named no stalled tool says so, in words
    b_stalls = page.locator(f'#nodes-table tr[data-facts-of="{seeded.nodes["gpu-b"]}"] li[data-fact="tool-stalls"]')
    expect(b_stalls).to_contain_text("none reported" if lang == "en" else "未报告")
    # 800 px: neither the page nor the table scrolls sideways
    overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 1, f"the nodes page scrolls sideways by {overflow}px at 800px ({lang})"
    wrap = page.locator("#nodes-table").locator("xpath=..")
    scroll = wrap.evaluate("el => el.scrollWidth - el.clientWidth")
    assert scroll <= 1, f"the nodes table scrolls sideways by {scroll}px at 800px ({lang})"


def test_alerts_resolve_with_a_reason_and_audit_trail(open_page: Open, seeded: Seeded) -> None:
    from playwright.sync_api import expect

    alert_id = seeded.resolvable_alert
    # A token without alerts:write is not offered the resolve form: its scopes (whoami) say it may not resolve.
    told = open_page("/alerts", token=seeded.readonly)
    told.locator(f'#alerts-table tr[data-id="{alert_id}"]').click()
    expect(told.locator("#resolve-unavailable")).to_be_visible()
    expect(told.locator("#resolve-submit")).to_have_count(0)
    expect(told.locator("#resolve-reason")).to_have_attribute("readonly", "")
    # When whoami fails (unknown scopes), the form is offered: the server refuses, and the alert stays open.
    readonly = open_page("", token=seeded.readonly)
    readonly.route("**/api/v1/auth/whoami", lambda route: route.abort())
    readonly.goto(seeded.base_url + "/alerts")
    readonly.locator(f'#alerts-table tr[data-id="{alert_id}"]').click()
    readonly.fill("#resolve-reason", "card replaced")
    readonly.click("#resolve-submit")
    expect(readonly.locator("#resolve-message")).to_have_text("This token lacks the alerts:write scope (403).")
    # the typed reason is kept, the form is not offered again to this token
    expect(readonly.locator("#resolve-reason")).to_have_value("card replaced")
    expect(readonly.locator("#resolve-reason")).to_have_attribute("readonly", "")
    expect(readonly.locator("#resolve-submit")).to_have_count(0)
    expect(readonly.locator("#resolve-unavailable")).to_contain_text("Your reason is kept above")

    page = open_page("/alerts")
    expect(page.locator("#alert-filter")).to_have_value("open")
    row = page.locator(f'#alerts-table tr[data-id="{alert_id}"]')
    expect(row.locator(".badge.alert-open")).to_be_visible()
    row.focus()
    page.keyboard.press("Enter")
    expect(page.locator("#alert-history tbody tr")).to_have_count(1)
    page.click("#resolve-submit")  # no reason: refused by the page
    expect(page.locator("#resolve-message")).to_have_text("Give a reason (1–2000 characters).")
    # The rest by keyboard only.
    page.locator("#alert-detail").focus()
    page.keyboard.press("Tab")
    expect(page.locator("#resolve-reason")).to_be_focused()
    page.keyboard.type("card replaced in maintenance window MW-42")
    page.keyboard.press("Tab")
    expect(page.locator("#resolve-submit")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("#resolve-message")).to_have_text("Resolved.")
    history = page.locator("#alert-history tbody tr")
    expect(history).to_have_count(2)
    expect(history.nth(1)).to_contain_text("resolved")
    expect(history.nth(1)).to_contain_text("card replaced in maintenance window MW-42")
    expect(history.nth(1)).to_contain_text(re.compile(r"token:web-test:"))
    expect(page.locator("#resolve-form")).to_have_count(0)
    expect(page.locator(f'#alerts-table tr[data-id="{alert_id}"]')).to_have_count(0)  # no longer open
    page.select_option("#alert-filter", "resolved")
    resolved = page.locator(f'#alerts-table tr[data-id="{alert_id}"]')
    expect(resolved).to_contain_text("card replaced in maintenance window MW-42")
    expect(page.locator("#alerts-table")).to_contain_text("job finished")
    detail = api(seeded, f"/api/v1/alerts/{alert_id}")
    assert detail["alert"]["status"] == "resolved"


def test_an_alert_shows_its_runbook_in_both_languages(open_page: Open, seeded: Seeded) -> None:
    from playwright.sync_api import expect

    page = open_page(f"/alerts?alert={seeded.resolvable_alert}")  # a GPU_FAULT_PREDICTED alert
    runbook = page.locator("#alert-runbook")
    expect(runbook).to_have_attribute("data-type", "GPU_FAULT_PREDICTED")
    expect(runbook.locator("h3")).to_have_text("What to do")
    expect(runbook.locator("li")).to_have_count(4)
    expect(runbook.locator("li").nth(2)).to_contain_text("Never reset a card with pending remaps before it is drained")
    expect(runbook).to_contain_text("docs/runbooks/platform/GPU_FAULT_PREDICTED.md")
    page.select_option("#lang", "zh")
    expect(runbook.locator("h3")).to_have_text("处置步骤")
    expect(runbook.locator("li").nth(2)).to_contain_text("排空之前切勿重置")
    expect(runbook).to_contain_text("docs/runbooks/platform/GPU_FAULT_PREDICTED.md")


# ---- language, layout, schemes -------------------------------------------------------------------------------
def test_language_switch_english_and_chinese(open_page: Open, seeded: Seeded) -> None:
    from playwright.sync_api import expect

    page = loaded(open_page("/nodes/gpu-health"))
    page.select_option("#lang", "zh")
    expect(page.locator("html")).to_have_attribute("lang", "zh-CN")
    expect(page.locator("#calibration-heading")).to_have_text("初始经验阈值，待真实数据校准。")
    expect(page.locator('#stats [data-band="30"] .insufficient strong')).to_have_text("样本不足，暂不给命中率")
    expect(page.locator('#stats [data-band="30"] li')).to_contain_text(["已回填 2 条 / 需 ≥ 20 条"])
    expect(page.locator("#pred-table .badge.unrecognised").first).to_have_text("未识别")
    expect(page.locator("#caps-table .badge.stalled").first).to_have_text("采集停滞")
    expect(page.locator("#nav")).to_contain_text("GPU 健康")
    expect(page.locator("#caps-table tr.more-cards").first).to_contain_text("张卡全部指标未知")
    # Chinese glyphs are drawn (a CJK font is installed: fonts-noto-cjk), not the "missing glyph" box that a
    # private-use character gets
    drawn = page.evaluate(
        """() => {
          const pixels = (text) => {
            const canvas = document.createElement('canvas');
            canvas.width = 64; canvas.height = 32;
            const ctx = canvas.getContext('2d');
            ctx.font = '24px sans-serif';
            ctx.fillText(text, 2, 26);
            return Array.from(ctx.getImageData(0, 0, 64, 32).data).join(',');
          };
          // without a CJK font every one of them is the same missing-glyph box
          const missing = pixels('\\uE000');
          const glyphs = ['采', '未', '推'].map(pixels);
          return glyphs.map((g, i) => g !== missing && glyphs.every((other, j) => i === j || other !== g));
        }"""
    )
    assert drawn == [True, True, True], "Chinese text renders as missing-glyph boxes: install fonts-noto-cjk"
    # The API's texts come with a code: shown in Chinese, the API's parameters filled in
    expect(page.locator("#caps-note")).to_have_text(re.compile("^采集能力来自实际收到的样本"))
    expect(page.locator("#calibration-text")).to_contain_text("至少 20 条已成熟预测且观察满 8 天")
    # ... the evidence of the worker's own prediction (gpu-a GPU 0), line by line; seeded free text stays as written
    page.goto(seeded.base_url + "/nodes/gpu-health?type=corrected_ecc_growth")
    evidence = page.locator("#pred-table .evidence pre").first
    expect(evidence).to_contain_text(re.compile(r"^趋势信号 \[corrected_ecc_growth\]: 最近 \S+ 可纠正 ECC 增加 \d+"))
    expect(evidence).to_contain_text("严格递增")
    page.goto(seeded.base_url + "/nodes/gpu-health?status=miss")
    expect(page.locator("#pred-table .evidence pre").first).to_contain_text(re.compile("signal|operator note"))
    # ... and the alerts: the worker's message, its audit trail (action, actor, note) in Chinese; typed text as is
    page.goto(seeded.base_url + "/alerts?filter=all")
    raised = page.locator('#alerts-table td.message[data-code="alert.fault_predicted"]')
    expect(raised).to_have_count(1)
    expect(raised).to_contain_text(re.compile(r"^预测 gpu-a GPU 0 \(SIM-degrading-0000\) 将在 7 天内出现显存故障"))
    expect(raised).to_contain_text("证据：趋势信号 [corrected_ecc_growth]")
    expect(page.locator("#alerts-table")).to_contain_text("GPU 0 memory used 97% (the card itself is fine)")
    expect(page.locator('#alerts-table td[data-severity="WARN"]').first).to_have_text("警告")
    raised.click()
    trail = page.locator("#alert-history tbody tr").first
    expect(trail).to_contain_text("产生")
    expect(trail).to_contain_text("系统")
    expect(trail.locator("td").nth(3)).to_contain_text(re.compile("^预测 gpu-a GPU 0"))
    # The choice is remembered for the next page.
    seeded.beat("gpu-a")
    page.goto(seeded.base_url + "/nodes")
    expect(page.locator("#nodes-table")).to_contain_text("在线")
    page.select_option("#lang", "en")
    expect(page.locator("#nodes-table")).to_contain_text("Online")
    expect(page.locator("html")).to_have_attribute("lang", "en")


def test_narrow_window_and_dark_scheme(open_page: Open, seeded: Seeded) -> None:
    from playwright.sync_api import expect

    page = loaded(open_page("/nodes/gpu-health", width=390, color_scheme="dark"))
    overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 1, f"the page scrolls sideways by {overflow}px at 390px"
    background = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert background == "rgb(17, 20, 24)"
    expect(page.locator("#calibration")).to_be_visible()
    # Keyboard: the skip link is the first stop, then the navigation.
    page.keyboard.press("Tab")
    expect(page.locator(".skip")).to_be_focused()


def test_a_tab_follows_a_sign_in_made_again_in_another_tab(open_page: Open, seeded: Seeded) -> None:
    from playwright.sync_api import expect

    first = open_page("/alerts", token=seeded.reader)
    expect(first.locator("#alert-filter")).to_be_visible()
    second = first.context.new_page()
    second.goto(seeded.base_url + "/alerts")
    second.click("#signout")
    second.fill("#token", seeded.reader)
    second.click("#signin-submit")
    expect(second.locator("#alert-filter")).to_be_visible()
    # the first tab still holds the old session's CSRF token: its write is refused once, then retried with the
    # new session's (no such alert: 404, past every check)
    status = first.evaluate(
        """async () => {
          const { api } = await import("/ui/api.js");
          try { await api("/api/v1/alerts/no-such-alert/resolve", { body: { reason: "checked" } }); return 200; }
          catch (err) { return err.status; }
        }"""
    )
    assert status == 404


def test_an_ended_session_returns_to_sign_in(open_page: Open, seeded: Seeded) -> None:
    from playwright.sync_api import expect

    page = open_page("/alerts", token=seeded.reader)
    expect(page.locator("#alert-filter")).to_be_visible()
    page.context.clear_cookies()  # the session is gone (expired, or signed out in another browser)
    page.select_option("#alert-filter", index=1)  # the page's next call is refused
    expect(page.locator("#signin-message")).to_have_text(
        "Your session has ended (401): signed out, expired, or its token revoked. Please sign in again."
    )
    page.select_option("#lang", "zh")
    expect(page.locator("#signin-message")).to_have_text(
        "会话已结束（401）：已退出、已过期或其令牌已被吊销。请重新登录。"
    )
    expect(page.locator("#signin-where")).to_contain_text("还没有令牌？")


def test_nodes_page_draws_per_gpu_sparklines_with_gaps_for_unknown_minutes(open_page: Open, seeded: Seeded) -> None:
    from playwright.sync_api import expect

    from heteroflow.core.clock import SystemClock
    from heteroflow.health.gpu_metrics import Aggregate, MinuteRow, minute_of

    key = CardKey(node_id=NodeId(seeded.nodes["gpu-a"]), gpu_index=0, source="real")
    start = minute_of(SystemClock().now()) - timedelta(minutes=20)

    def agg(value: float) -> Aggregate:
        return Aggregate(min=value, avg=value, max=value, count=12)

    rows = [
        MinuteRow(
            key=key,
            uuid="GPU-spark",
            minute=start + timedelta(minutes=m),
            samples=12,
            values={
                "utilization_pct": agg(50 + m),
                "memory_used_mib": agg(40_000),
                "memory_total_mib": agg(80_000),
                "temperature_c": None if m == 10 else agg(60),  # one unknown minute: a gap, not a 0
                "power_w": None,  # never reported: no line at all
            },
        )
        for m in range(20)
    ]
    seeded.ctx.gpu_metrics.insert(rows)
    page = open_page("/nodes")
    row = page.locator(f'#nodes-table tr[data-node="{seeded.nodes["gpu-a"]}"]')
    row.get_by_role("button", name="Show last hour").click()
    gpu = page.locator(f'tr[data-metrics-of="{seeded.nodes["gpu-a"]}"] .spark-gpu[data-gpu="0"]')
    expect(gpu).to_contain_text("GPU-spark")
    expect(gpu.locator('.spark[data-metric="utilization_pct"] polyline')).to_have_count(1)
    expect(gpu.locator('.spark[data-metric="temperature_c"]')).to_have_attribute("data-segments", "2")
    expect(gpu.locator('.spark[data-metric="memory_pct"] .spark-value')).to_have_text("50 %")
    expect(gpu.locator('.spark[data-metric="power_w"]')).to_have_attribute("data-state", "unknown")
    expect(gpu.locator('.spark[data-metric="power_w"]')).to_contain_text("Unknown")
    row.get_by_role("button", name="Hide").click()
    expect(page.locator(f'tr[data-metrics-of="{seeded.nodes["gpu-a"]}"]')).to_have_count(0)
