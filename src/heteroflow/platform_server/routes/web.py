"""The web pages: a static shell (HTML, ES modules, CSS) served by the platform server itself.

The shell is public because it must load before sign-in, and it carries no data: every data call is made by the
browser with the session cookie that signing in with a token starts (:mod:`heteroflow.platform_server.sessions`).
None of these routes is part of the API, so they are left out of the OpenAPI schema.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final, Literal

from fastapi import APIRouter
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response

from heteroflow.core.text import text_problem
from heteroflow.platform_server.errors import NotFound

WEB_ROOT: Final = Path(__file__).resolve().parent.parent / "web"
"""``src/heteroflow/platform_server/web``: ``shell.html`` and the ``ui/`` assets (package data)."""

STATIC_PREFIX: Final = "/ui"

_MEDIA_TYPES: Final = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}

# Same-origin only: no CDN, no inline script, no external font. Styles set through the CSSOM (element.style)
# are not inline style attributes, so 'self' suffices for style-src too.
_SECURITY_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # The assets change with the server version; revalidating keeps a stale module from mixing with a new one.
    "Cache-Control": "no-cache",
}

router = APIRouter(include_in_schema=False)


PageName = Literal["gpu-health", "nodes", "alerts", "serving"]


def _shell(page: PageName) -> HTMLResponse:
    """The shell with the page named on ``<body>``, so the CSS shows the calibration notice before any script."""
    html = (WEB_ROOT / "shell.html").read_text(encoding="utf-8").replace("{{page}}", page)
    return HTMLResponse(html, headers=_SECURITY_HEADERS)


@router.get("/")
async def root() -> RedirectResponse:
    return RedirectResponse("/nodes/gpu-health", status_code=307)


@router.get("/nodes/gpu-health")
async def gpu_health_page() -> HTMLResponse:
    return _shell("gpu-health")


@router.get("/nodes")
async def nodes_page() -> HTMLResponse:
    return _shell("nodes")


@router.get("/alerts")
async def alerts_page() -> HTMLResponse:
    return _shell("alerts")


@router.get("/serving")
async def serving_page() -> HTMLResponse:
    return _shell("serving")


@router.get(STATIC_PREFIX + "/{path:path}")
async def asset(path: str) -> Response:
    """A file under ``web/ui``; anything else (another suffix, a path escaping the folder, a NUL or other
    control character, which no file name of ours has and ``resolve`` would raise on) is 404."""
    if text_problem(path) is not None:
        raise NotFound("no such asset")
    root = (WEB_ROOT / "ui").resolve()
    target = (root / path).resolve()
    media_type = _MEDIA_TYPES.get(target.suffix)
    if media_type is None or not target.is_relative_to(root) or not target.is_file():
        raise NotFound(f"no asset {path!r}")
    return FileResponse(target, media_type=media_type, headers=_SECURITY_HEADERS)
