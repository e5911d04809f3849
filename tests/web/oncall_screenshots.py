"""Screenshots of what an on-call works from, English and Chinese at 1280 and 800 px, for docs/screenshots/: a
card's 30-day history with its level and XID events (card-history-<lang>-<width>.png), the predictions at 800 px
(predictions-800.png), the alerts page with a multi-card node alert (alerts-cards-<lang>-<width>.png; the browser
tests' seeded server) and the capability matrix filtered to cards with an unknown counter at 1,000 cards
(caps-unknown-<lang>-<width>.png; the fleet seed):
``.venv/bin/python -m tests.web.oncall_screenshots [OUTPUT_DIR]`` (default ``docs/screenshots``)."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from playwright._impl._api_structures import Clip
from playwright.sync_api import expect, sync_playwright

from tests.web.alert_cards_seed import seed_multi_card_alert
from tests.web.conftest import CHROMIUM, CHROMIUM_ARGS
from tests.web.fleet_seed import fleet_server
from tests.web.screenshots import DEFAULT_OUT
from tests.web.seed import seeded_server
from tests.web.session import sign_in


def take(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    shots: list[Path] = []
    with tempfile.TemporaryDirectory() as tmp, seeded_server(Path(tmp)) as seeded, sync_playwright() as p:
        multi = seed_multi_card_alert(seeded)
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        card = f"{seeded.nodes['gpu-a']}:0"
        for lang in ("en", "zh"):
            for width in (1280, 800):
                context = browser.new_context(viewport={"width": width, "height": 900})
                sign_in(context, seeded.base_url, seeded.reader)
                context.add_init_script(f"localStorage.setItem('heteroflow.lang', {json.dumps(lang)});")
                page = context.new_page()
                page.goto(f"{seeded.base_url}/nodes/gpu-health?card={card}&range=30")
                expect(page.locator("#ecc .chart p.level").first).to_be_visible(timeout=20_000)
                expect(page.locator("#card-xids")).to_be_visible(timeout=20_000)
                page.wait_for_timeout(300)
                path = out / f"card-history-{lang}-{width}.png"
                page.locator("#ecc").screenshot(path=str(path))
                shots.append(path)
                if lang == "en" and width == 800:
                    path = out / "predictions-800.png"
                    page.locator("#pred-table").scroll_into_view_if_needed()
                    page.screenshot(path=str(path))  # the first rows: one block each, the evidence unclipped
                    shots.append(path)
                context.close()
        for lang in ("en", "zh"):
            for width in (1280, 800):
                context = browser.new_context(viewport={"width": width, "height": 900})
                sign_in(context, seeded.base_url, multi.operator)
                context.add_init_script(f"localStorage.setItem('heteroflow.lang', {json.dumps(lang)});")
                page = context.new_page()
                page.goto(f"{seeded.base_url}/alerts?alert={multi.alert_id}")
                expect(page.locator("#alert-cards tbody tr")).to_have_count(3)
                page.wait_for_timeout(300)
                path = out / f"alerts-cards-{lang}-{width}.png"
                page.screenshot(path=str(path), full_page=True)
                shots.append(path)
                context.close()
        with fleet_server(Path(tmp) / "fleet") as fleet:
            for lang in ("en", "zh"):
                for width in (1280, 800):
                    context = browser.new_context(viewport={"width": width, "height": 900})
                    sign_in(context, fleet.base_url, fleet.reader)
                    context.add_init_script(f"localStorage.setItem('heteroflow.lang', {json.dumps(lang)});")
                    page = context.new_page()
                    page.goto(f"{fleet.base_url}/nodes/gpu-health?cunknown=any")
                    expect(page.locator("#caps-unknown-counts")).to_be_visible(timeout=20_000)
                    page.wait_for_timeout(300)
                    box = page.locator("#capabilities").bounding_box()
                    assert box is not None
                    path = out / f"caps-unknown-{lang}-{width}.png"
                    # the block's head, counts and first rows (the whole page of 50 cards is too tall to read)
                    clip: Clip = {
                        "x": box["x"],
                        "y": box["y"],
                        "width": box["width"],
                        "height": min(box["height"], 900),
                    }
                    page.screenshot(path=str(path), full_page=True, clip=clip)
                    shots.append(path)
                    context.close()
        browser.close()
    return shots


if __name__ == "__main__":
    for written in take(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT):
        print(written)
