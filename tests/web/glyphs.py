"""Missing glyphs on a page: each CJK character of its text, drawn in the page's own font, against the box a
character no installed font has (U+E000, private use) is drawn as. Without a CJK font every Chinese character
is that same box (tofu); with one, none is."""

from __future__ import annotations

from typing import Any

# Every distinct CJK character of the page's visible text (and of its form controls' options), each drawn on a
# canvas in the body's computed font; those whose pixels equal the missing-glyph box's.
_MISSING_GLYPHS = """() => {
  const font = getComputedStyle(document.body).font.replace(/^.*?(\\d+(\\.\\d+)?px)/, '24px');
  const draw = (text) => {
    const canvas = document.createElement('canvas');
    canvas.width = 40; canvas.height = 40;
    const ctx = canvas.getContext('2d');
    ctx.font = font;
    ctx.fillText(text, 4, 30);
    return Array.from(ctx.getImageData(0, 0, 40, 40).data).join(',');
  };
  const text = document.body.innerText + Array.from(document.querySelectorAll('option')).map((o) => o.text).join('');
  const cjk = /[\\u3400-\\u9fff\\uff00-\\uffef\\u3000-\\u303f]/;
  const chars = Array.from(new Set(Array.from(text).filter((c) => cjk.test(c))));
  const box = draw('\\uE000');
  return { font, count: chars.length, missing: chars.filter((c) => draw(c) === box) };
}"""


def missing_glyphs(page: Any) -> dict[str, Any]:
    """``{"font", "count": distinct CJK characters on the page, "missing": those drawn as the missing box}``."""
    result: dict[str, Any] = page.evaluate(_MISSING_GLYPHS)
    return result


def assert_no_missing_glyphs(page: Any, *, at_least: int = 20) -> None:
    found = missing_glyphs(page)
    assert found["count"] >= at_least, f"only {found['count']} Chinese characters on the page: is it in Chinese?"
    assert not found["missing"], (
        f"{len(found['missing'])} of {found['count']} Chinese characters render as missing-glyph boxes "
        f"in {found['font']!r}: {''.join(found['missing'][:40])} (install fonts-noto-cjk)"
    )
