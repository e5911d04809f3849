"""The alerts page as an on-call works from it, in a real headless Chromium against the seeded server: a node's
alert lists every predicted card with its severity and links each to its history on the right source; the filters
live in the URL; acknowledging is apart from resolving; both languages, at 1280 and 800 px."""

from __future__ import annotations

import re

import pytest

from tests.web.alert_cards_seed import MultiCardAlert, seed_multi_card_alert
from tests.web.seed import Seeded
from tests.web.test_pages_browser import Open, _expect_timeout, api, open_page

pytestmark = pytest.mark.browser
__all__ = ["_expect_timeout", "open_page"]


@pytest.fixture(scope="module")
def multi(seeded: Seeded) -> MultiCardAlert:
    return seed_multi_card_alert(seeded)


def test_a_node_alert_lists_every_predicted_card_and_links_each_to_its_history(
    open_page: Open, seeded: Seeded, multi: MultiCardAlert
) -> None:
    from playwright.sync_api import expect

    body = api(seeded, "/api/v1/alerts", token=multi.operator, status="open")
    [alert] = [a for a in body["items"] if a["id"] == multi.alert_id]
    assert alert["severity"] == "CRITICAL"
    assert alert["cards"][0]["gpu_index"] == 3  # the remap failure first
    assert sorted(c["gpu_index"] for c in alert["cards"]) == [0, 1, 3]

    page = open_page("/alerts", token=multi.operator)
    row = page.locator(f'#alerts-table tr[data-id="{multi.alert_id}"]')
    expect(row.locator('td[data-severity="CRITICAL"]')).to_have_text("Critical")
    links = row.locator("ul.alert-cards li a.card-link")
    expect(links).to_have_text(["GPU 3", "GPU 0", "GPU 1"])
    expect(row.locator('ul.alert-cards li[data-gpu="3"]')).to_contain_text("Row-remap failure")
    expect(links.first).to_have_attribute("href", f"/nodes/gpu-health?card={multi.node_id}%3A3")

    row.click()
    cards = page.locator("#alert-cards tbody tr")
    expect(cards).to_have_count(3)
    expect(cards.first.locator(".badge")).to_have_text("Critical")
    expect(cards.first).to_contain_text("spare rows exhausted")
    history = page.locator("#alert-history tbody tr")
    expect(history.filter(has_text="card added")).to_have_count(2)

    # the card's link opens the GPU health page on that card, real source
    cards.first.locator("a.card-link").click()
    expect(page).to_have_url(re.compile(r"/nodes/gpu-health\?card="))
    expect(page.locator("#source-real")).to_be_checked()
    assert f"card={multi.node_id}%3A3" in page.url


def test_filters_are_in_the_url_and_narrow_the_list(open_page: Open, multi: MultiCardAlert) -> None:
    from playwright.sync_api import expect

    page = open_page("/alerts?severity=CRITICAL&gpu=3&node=other", token=multi.operator)
    expect(page.locator("#alert-severity")).to_have_value("CRITICAL")
    expect(page.locator("#alert-gpu")).to_have_value("3")
    expect(page.locator("#alert-node")).to_have_value("other")
    expect(page.locator(f'#alerts-table tr[data-id="{multi.alert_id}"]')).to_have_count(1)
    page.fill("#alert-gpu", "5")
    page.locator("#alert-gpu").press("Enter")
    expect(page.locator("#alerts-title ~ p.empty, p.empty")).to_have_text("No alerts match.")
    assert "gpu=5" in page.url
    page.select_option("#alert-severity", "WARN")
    assert "severity=WARN" in page.url
    page.goto(page.url.split("?")[0] + "?severity=LOUD&gpu=x&state=nonsense")
    expect(page.locator("#alert-severity")).to_have_value("all")
    expect(page.locator("#alert-filter")).to_have_value("open")
    expect(page.locator(f'#alerts-table tr[data-id="{multi.alert_id}"]')).to_have_count(1)


def test_acknowledge_keeps_the_alert_open_with_who_when_and_note(
    open_page: Open, seeded: Seeded, multi: MultiCardAlert
) -> None:
    from playwright.sync_api import expect

    page = open_page(f"/alerts?alert={multi.alert_id}", token=multi.operator)
    page.fill("#ack-note", "draining gpu-other tonight, ticket OPS-7")
    page.click("#ack-submit")
    expect(page.locator("#resolve-message")).to_have_text("Acknowledged.")
    expect(page.locator("#ack-status")).to_contain_text("draining gpu-other tonight, ticket OPS-7")
    expect(page.locator("#ack-status")).to_contain_text(re.compile(r"Acknowledged by token:web-test:"))
    expect(page.locator("#alert-history tbody tr").last).to_contain_text("acknowledged")
    expect(page.locator("#resolve-form")).to_be_visible()  # still open: resolving is a separate step
    row = page.locator(f'#alerts-table tr[data-id="{multi.alert_id}"]')
    expect(row.locator(".badge.acknowledged")).to_have_text("Acknowledged")
    page.select_option("#alert-filter", "unacknowledged")
    expect(page.locator(f'#alerts-table tr[data-id="{multi.alert_id}"]')).to_have_count(0)
    page.select_option("#alert-filter", "acknowledged")
    expect(page.locator(f'#alerts-table tr[data-id="{multi.alert_id}"]')).to_have_count(1)
    assert "filter=acknowledged" in page.url
    detail = api(seeded, f"/api/v1/alerts/{multi.alert_id}", token=multi.operator)
    assert detail["alert"]["status"] == "open"
    assert detail["alert"]["acknowledgement"] == "draining gpu-other tonight, ticket OPS-7"


@pytest.mark.parametrize("width", [1280, 800])
def test_chinese_and_narrow_nothing_clipped(open_page: Open, multi: MultiCardAlert, width: int) -> None:
    from playwright.sync_api import expect

    page = open_page(f"/alerts?alert={multi.alert_id}", token=multi.operator, lang="zh", width=width)
    row = page.locator(f'#alerts-table tr[data-id="{multi.alert_id}"]')
    expect(row.locator('td[data-severity="CRITICAL"]')).to_have_text("严重")
    expect(page.locator("#alerts-table thead")).to_contain_text("预测的卡")
    expect(page.locator("#alert-cards tbody tr").first).to_contain_text("行重映射失败")
    expect(page.locator("#alert-history tbody tr").filter(has_text="新增卡")).to_have_count(2)
    expect(page.locator("label[for=alert-severity]")).to_have_text("级别")
    expect(page.locator("#ack-submit")).to_have_text("确认告警")
    # no horizontal page scroll; the detail's cards table fits its block
    overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 0, f"page scrolls sideways by {overflow}px at {width}px"
    for table in ("#alert-cards", "#alerts-table"):
        clipped = page.locator(table).locator("xpath=..").evaluate("el => el.scrollWidth - el.clientWidth")
        assert clipped <= 0, f"{table} is clipped by {clipped}px at {width}px"


def test_enter_on_a_card_link_opens_the_card_not_the_alert(open_page: Open, multi: MultiCardAlert) -> None:
    from playwright.sync_api import expect

    page = open_page("/alerts", token=multi.operator)
    link = page.locator(f'#alerts-table tr[data-id="{multi.alert_id}"] ul.alert-cards a.card-link').first
    link.focus()
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile(r"/nodes/gpu-health\?card="))
