"""The capability matrix's own filters, order and page in a real headless Chromium: each is served by the API
(``/api/v1/gpu-health/capabilities`` with ``node_id``, ``q``, ``sort``, ``limit``/``offset``) and kept in the URL."""

from __future__ import annotations

import pytest

from tests.web.seed import Seeded
from tests.web.test_pages_browser import Open, _expect_timeout, api, loaded, open_page

pytestmark = pytest.mark.browser
__all__ = ["_expect_timeout", "open_page"]


def test_node_filter_search_and_order_are_served_by_the_api_and_kept_in_the_url(
    open_page: Open, seeded: Seeded
) -> None:
    from playwright.sync_api import expect

    node = seeded.nodes["gpu-a"]
    of_node = api(seeded, "/api/v1/gpu-health/capabilities", node_id=node, limit=50)
    assert of_node["total"] == len(of_node["cards"]) >= 4  # a swapped card is a row of its own
    page = loaded(open_page("/nodes/gpu-health"))
    rows = page.locator("#caps-table tbody tr:not(.more-cards)")
    page.select_option("#caps-node", value=node)
    expect(rows).to_have_count(of_node["total"])
    expect(page.locator(f"#caps-table tbody tr:not([data-node='{node}'])")).to_have_count(0)
    expect(page.locator("#caps-pager")).to_have_text(f"{of_node['total']} cards")
    assert f"cnode={node}" in page.url

    page.select_option("#caps-sort", value="stalled_first")
    expect(rows.first).to_have_attribute("data-stalled", "true")  # the card silent longest leads
    assert "csort=stalled_first" in page.url

    page.fill("#caps-search", "GPU-stalled")
    page.click("#caps-search-go")
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-index", "3")
    assert "cq=GPU-stalled" in page.url

    page.reload()
    loaded(page)
    expect(page.locator("#caps-node")).to_have_value(node)
    expect(page.locator("#caps-sort")).to_have_value("stalled_first")
    expect(page.locator("#caps-search")).to_have_value("GPU-stalled")
    expect(rows).to_have_count(1)

    page.fill("#caps-search", "no-such-card")
    page.click("#caps-search-go")
    expect(page.locator("#caps-empty")).to_have_text("No card matches these filters.")
    expect(page.locator("#caps-pager")).to_have_text("0 cards")


def test_the_matrix_controls_in_chinese(open_page: Open, seeded: Seeded) -> None:
    from playwright.sync_api import expect

    page = loaded(open_page("/nodes/gpu-health?cq=no-such-card", lang="zh"))
    expect(page.locator("label[for='caps-node']")).to_have_text("节点")
    expect(page.locator("#caps-sort option[value='stalled_first']")).to_have_text("最久未上报优先")
    expect(page.locator("#caps-empty")).to_have_text("没有符合这些筛选条件的卡。")
    expect(page.locator("#caps-pager")).to_have_text("共 0 张卡")


def test_the_serving_dashboards_card_link_shows_that_card(open_page: Open, seeded: Seeded) -> None:
    """``?node=<name>&gpu=<index>`` (a rank's link on /serving): that node's cards, and that card in the chart."""
    from playwright.sync_api import expect

    node = seeded.nodes["gpu-a"]
    page = loaded(open_page("/nodes/gpu-health?node=gpu-a&gpu=1"))
    expect(page.locator("#ecc-card")).to_have_value(f"{node}|1")
    expect(page.locator("#pred-search")).to_have_value("gpu-a")
    assert f"card={node}%3A1" in page.url or f"card={node}:1" in page.url


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_card_link_to_a_simulated_node_opens_the_simulated_source_and_that_card(
    open_page: Open, seeded: Seeded, lang: str
) -> None:
    """A rank's link names the node, not its source: ``?node=sim-demo&gpu=1`` opens the simulated source on
    sim-demo's GPU 1, never the real source's first card."""
    from playwright.sync_api import expect

    node = seeded.nodes["sim-demo"]
    page = open_page("/nodes/gpu-health?node=sim-demo&gpu=1", lang=lang)
    expect(page.locator("#source-simulated")).to_be_checked()
    expect(page.locator("#ecc-card")).to_have_value(f"{node}|1", timeout=20_000)
    expect(page.locator("#sim-banner")).to_be_visible()
    assert "source=simulated" in page.url
    assert f"card={node}%3A1" in page.url or f"card={node}:1" in page.url
