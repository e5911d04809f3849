"""Screenshots of the serving dashboard for docs/screenshots/ (serving-en.png, serving-zh.png, serving-800.png,
serving-800-zh.png),
from the same live controller the browser tests use (a real DP scale-down of rank 1):
``.venv/bin/python -m tests.web.serving_screenshots [OUTPUT_DIR]`` (default ``docs/screenshots``)."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from playwright.sync_api import expect, sync_playwright

from tests.web.conftest import CHROMIUM, CHROMIUM_ARGS
from tests.web.screenshots import DEFAULT_OUT
from tests.web.serving_seed import serving_server
from tests.web.session import sign_in


def take(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    shots: list[Path] = []
    with tempfile.TemporaryDirectory() as tmp, serving_server(Path(tmp)) as seeded, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        for lang, width, name in (
            ("en", 1280, "serving-en"),
            ("zh", 1280, "serving-zh"),
            ("en", 800, "serving-800"),
            ("zh", 800, "serving-800-zh"),
        ):
            context = browser.new_context(viewport={"width": width, "height": 900})
            sign_in(context, seeded.base_url, seeded.admin)
            context.add_init_script(f"localStorage.setItem('heteroflow.lang', {json.dumps(lang)});")
            page = context.new_page()
            page.goto(f"{seeded.base_url}/serving")
            expect(page.locator(".instance ol.timeline")).to_be_visible(timeout=20_000)
            expect(page.locator(".instance .round-story .story-clients")).to_be_visible(timeout=20_000)
            page.wait_for_timeout(300)
            path = out / f"{name}.png"
            page.screenshot(path=str(path), full_page=True)
            shots.append(path)
            context.close()
        browser.close()
    return shots


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT
    for written in take(target):
        print(written)
