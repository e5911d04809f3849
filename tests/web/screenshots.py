"""Screenshots of every page (real and simulated mode) for docs/screenshots/, from the same seeded server the
browser tests use: ``.venv/bin/python -m tests.web.screenshots [OUTPUT_DIR]`` (default ``docs/screenshots``)."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from playwright.sync_api import expect, sync_playwright

from tests.web.conftest import CHROMIUM, CHROMIUM_ARGS
from tests.web.seed import Seeded, seeded_server
from tests.web.session import sign_in

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "docs" / "screenshots"


def _page(browser: Any, seeded: Seeded, *, width: int = 1280, scheme: str = "light", lang: str = "en") -> Any:
    context = browser.new_context(viewport={"width": width, "height": 900}, color_scheme=scheme)
    sign_in(context, seeded.base_url, seeded.reader)
    context.add_init_script(f"localStorage.setItem('heteroflow.lang', {json.dumps(lang)});")
    return context.new_page()


def _gpu_health(page: Any, seeded: Seeded, query: str = "") -> None:
    page.goto(f"{seeded.base_url}/nodes/gpu-health{query}")
    expect(page.locator("#caps-note")).to_be_visible(timeout=20_000)
    expect(page.locator("#ecc .chart").first).to_be_visible(timeout=20_000)


def take(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    shots: list[Path] = []
    with tempfile.TemporaryDirectory() as tmp, seeded_server(Path(tmp)) as seeded, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)

        def shot(page: Any, name: str, *, full: bool = True) -> None:
            page.wait_for_timeout(300)
            path = out / f"{name}.png"
            page.screenshot(path=str(path), full_page=full)
            shots.append(path)
            page.context.close()

        page = _page(browser, seeded)
        _gpu_health(page, seeded)
        page.select_option("#ecc-card", value=f"{seeded.nodes['gpu-a']}|2")  # a card with unknown hours
        expect(page.locator('#ecc .chart[data-metric="ecc_corrected_total"] rect.bar-unknown').first).to_be_attached()
        shot(page, "gpu-health-real")

        page = _page(browser, seeded)
        _gpu_health(page, seeded, "?source=simulated")
        shot(page, "gpu-health-simulated")

        page = _page(browser, seeded, lang="zh")
        _gpu_health(page, seeded)
        shot(page, "gpu-health-zh", full=False)

        page = _page(browser, seeded, width=390, scheme="dark")
        _gpu_health(page, seeded, "?source=simulated")
        shot(page, "gpu-health-narrow-dark", full=False)

        seeded.beat("gpu-a")
        page = _page(browser, seeded)
        page.goto(f"{seeded.base_url}/nodes")
        expect(page.locator("#nodes-table")).to_be_visible()
        shot(page, "nodes")

        page = _page(browser, seeded)
        page.goto(f"{seeded.base_url}/alerts")
        page.locator("#alerts-table tbody tr").first.click()
        expect(page.locator("#alert-history")).to_be_visible()
        shot(page, "alerts")

        page = _page(browser, seeded, lang="zh")
        page.goto(f"{seeded.base_url}/alerts?filter=all")
        page.locator('#alerts-table td.message[data-code="alert.fault_predicted"]').first.click()
        expect(page.locator("#alert-history")).to_be_visible()
        shot(page, "alerts-zh")

        page = _page(browser, seeded)
        page.goto(f"{seeded.base_url}/alerts?")
        page.select_option("#alert-filter", "resolved")
        page.locator("#alerts-table tbody tr").first.click()
        expect(page.locator("#alert-history tbody tr")).to_have_count(2)
        shot(page, "alerts-resolved")

        for lang, name in (("en", "sign-in-failed"), ("zh", "sign-in-zh")):
            context = browser.new_context(viewport={"width": 1280, "height": 700})
            context.add_init_script(f"localStorage.setItem('heteroflow.lang', {json.dumps(lang)});")
            page = context.new_page()
            page.goto(f"{seeded.base_url}/nodes/gpu-health")
            page.fill("#token", "not-a-token")
            page.click("#signin-submit")
            expect(page.locator("#signin-message")).to_contain_text("401")
            shot(page, name, full=False)
        browser.close()
    return shots


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT
    for written in take(target):
        print(written)
