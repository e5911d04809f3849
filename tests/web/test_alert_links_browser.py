"""A selected alert is in the URL (``/alerts?alert=<id>``, with the filter): it can be linked, bookmarked and
reloaded, in a real headless Chromium against the seeded server."""

from __future__ import annotations

import re

import pytest

from tests.web.seed import Seeded
from tests.web.test_pages_browser import Open, _expect_timeout, api, open_page

pytestmark = pytest.mark.browser
__all__ = ["_expect_timeout", "open_page"]


def test_a_linked_alert_opens_its_detail_and_the_selection_is_written_to_the_url(
    open_page: Open, seeded: Seeded
) -> None:
    from playwright.sync_api import expect

    resolved = api(seeded, "/api/v1/alerts", status="resolved")["items"]
    assert resolved
    alert = resolved[0]
    # the link opens the detail even though the default filter (open) hides the alert's row
    page = open_page(f"/alerts?alert={alert['id']}")
    expect(page.locator("#alert-detail .message")).to_have_text(alert["message"])
    expect(page.locator("#alert-filter")).to_have_value("open")
    page.click("#detail-close")
    expect(page.locator("#alert-detail .message")).to_have_count(0)
    assert "alert=" not in page.url

    page.select_option("#alert-filter", "resolved")
    row = page.locator(f'#alerts-table tr[data-id="{alert["id"]}"]')
    row.click()
    expect(row).to_have_class(re.compile(r"\bselected\b"))
    assert "filter=resolved" in page.url
    assert f"alert={alert['id']}" in page.url
    page.reload()
    expect(page.locator("#alert-filter")).to_have_value("resolved")
    expect(page.locator(f'#alerts-table tr[data-id="{alert["id"]}"]')).to_have_class(re.compile(r"\bselected\b"))
    expect(page.locator("#alert-detail .message")).to_have_text(alert["message"])


def test_an_unknown_alert_in_the_url_is_an_error_in_the_detail_not_a_broken_page(
    open_page: Open, seeded: Seeded
) -> None:
    from playwright.sync_api import expect

    page = open_page("/alerts?alert=no-such-alert&filter=bogus")
    expect(page.locator("#alert-filter")).to_have_value("open")
    expect(page.locator("#alert-detail .error, #alert-detail [role=alert]").first).to_be_visible()
    expect(page.locator("#alerts-table, #alerts-total").first).to_be_visible()
