"""Page load of the GPU health page at fleet scale, in a real headless Chromium against a live server.

Seeds the fleet of the fleet-scale browser test (``tests/web/fleet_seed.py``: 1,000 simulated cards by default,
one in 8 predicted this week), then times, per language, navigation to the answer of "which cards are predicted
this week, uncorrectable first?" — ``/nodes/gpu-health?status=pending&sort=strong_first`` — until its 50 rows are
rendered (the last of the page's own API calls answered and drawn), and until the whole page (statistics,
capability matrix, ECC chart) has rendered. A fresh browser context each time (no cache); one warm-up load, then
the median of ``--loads``.

Usage::

    .venv/bin/python bench/web_fleet.py [--cards 1000] [--loads 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the fleet lives with the browser tests

from playwright.sync_api import expect, sync_playwright
from tests.web.conftest import CHROMIUM, CHROMIUM_ARGS
from tests.web.fleet_seed import Fleet, fleet_server
from tests.web.session import sign_in

ANSWER = "/nodes/gpu-health?status=pending&sort=strong_first"


def load(browser: object, fleet: Fleet, lang: str) -> tuple[float, float]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})  # type: ignore[attr-defined]
    context.add_init_script(f"localStorage.setItem('heteroflow.lang', {json.dumps(lang)});")
    sign_in(context, fleet.base_url, fleet.reader)
    page = context.new_page()
    try:
        started = time.perf_counter()
        page.goto(fleet.base_url + ANSWER, wait_until="commit")
        first = page.locator(f'#pred-table tbody tr[data-id="{fleet.this_week[0]}"]')
        expect(page.locator("#pred-table tbody tr")).to_have_count(50, timeout=30_000)
        expect(first).to_be_visible(timeout=30_000)
        answer = time.perf_counter() - started
        expect(page.locator("#stats .stat-card")).to_have_count(2, timeout=30_000)
        expect(page.locator("#caps-pager")).to_be_visible(timeout=30_000)
        expect(page.locator("#ecc .chart").first).to_be_visible(timeout=30_000)
        whole = time.perf_counter() - started
    finally:
        context.close()
    return answer, whole


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--cards", type=int, default=1000)
    parser.add_argument("--loads", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hf-web-fleet-") as workdir:
        seeding = time.perf_counter()
        with fleet_server(Path(workdir), cards=args.cards) as fleet:
            seeded = time.perf_counter() - seeding
            print(f"{args.cards} cards seeded in {seeded:.1f} s; {len(fleet.this_week)} predicted this week")
            print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
            print(f"{'lang':<5} {'answer s (median)':>18} {'min':>6} {'max':>6} {'whole page s':>13}")
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
                for lang in ("en", "zh"):
                    load(browser, fleet, lang)  # warm-up: the server's and SQLite's caches
                    runs = [load(browser, fleet, lang) for _ in range(args.loads)]
                    answers = [a for a, _ in runs]
                    print(
                        f"{lang:<5} {statistics.median(answers):>18.3f} {min(answers):>6.3f} {max(answers):>6.3f} "
                        f"{statistics.median(w for _, w in runs):>13.3f}",
                        flush=True,
                    )
                browser.close()
            print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
