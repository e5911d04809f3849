"""Chinese pages draw every character in a real CJK font (fonts-noto-cjk), never as missing-glyph boxes; and the
check that says so fails in a Chromium that has no CJK font."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.web.conftest import CHROMIUM, CHROMIUM_ARGS
from tests.web.glyphs import assert_no_missing_glyphs, missing_glyphs
from tests.web.seed import Seeded
from tests.web.session import sign_in

pytestmark = pytest.mark.browser

PAGES = {
    "/nodes/gpu-health": "#caps-note",
    "/alerts": "#alerts-table",
    "/nodes": "#nodes-table",
}


def open_zh(browser: Any, seeded: Seeded, path: str) -> tuple[Any, Any]:
    from playwright.sync_api import expect

    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.add_init_script("localStorage.setItem('heteroflow.lang', 'zh');")
    sign_in(context, seeded.base_url, seeded.reader)
    page = context.new_page()
    page.goto(seeded.base_url + path)
    expect(page.locator("html")).to_have_attribute("lang", "zh-CN")
    expect(page.locator(PAGES[path])).to_be_visible(timeout=15_000)
    return context, page


@pytest.mark.parametrize("path", list(PAGES))
def test_every_chinese_character_of_a_page_has_a_glyph(browser: Any, seeded: Seeded, path: str) -> None:
    context, page = open_zh(browser, seeded, path)
    try:
        assert_no_missing_glyphs(page)
    finally:
        context.close()


@pytest.fixture
def browser_without_cjk(browser: Any, tmp_path: Path) -> Iterator[Any]:
    """A Chromium whose fontconfig knows the DejaVu fonts only: what the test machine was before fonts-noto-cjk."""
    dejavu = Path("/usr/share/fonts/truetype/dejavu")
    if not dejavu.is_dir():
        pytest.skip("the DejaVu fonts (fonts-dejavu-core) are not installed")
    cache = tmp_path / "cache"
    config = tmp_path / "fonts.conf"
    config.write_text(
        '<?xml version="1.0"?><!DOCTYPE fontconfig SYSTEM "fonts.dtd">'
        f"<fontconfig><dir>{dejavu}</dir><cachedir>{cache}</cachedir></fontconfig>"
    )
    env = {"FONTCONFIG_FILE": str(config), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    bare = browser.browser_type.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS, env=env)
    yield bare
    bare.close()


def test_the_glyph_check_fails_without_a_cjk_font(browser_without_cjk: Any, seeded: Seeded) -> None:
    context, page = open_zh(browser_without_cjk, seeded, "/nodes/gpu-health")
    try:
        found = missing_glyphs(page)
        assert found["count"] >= 20
        assert len(found["missing"]) == found["count"], found
        with pytest.raises(AssertionError, match="render as missing-glyph boxes"):
            assert_no_missing_glyphs(page)
    finally:
        context.close()
