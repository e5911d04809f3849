"""Structured logging set-up, shared by every HeteroFlow process."""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

_SECRET_KEYS = frozenset({"token", "authorization", "password", "secret", "admin_token", "cluster_token"})


def _redact_secrets(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Tokens never reach a log line, whoever passes them by mistake."""
    for key in list(event):
        if key.lower() in _SECRET_KEYS:
            event[key] = "[redacted]"
    return event


def configure_logging(*, level: str = "info", json: bool = True) -> None:
    """Route structlog and the standard library to stderr, as JSON lines or for a console."""
    numeric = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    renderer: Any = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _redact_secrets,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(level=numeric, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s", force=True)
    # httpx logs every request's whole URL at INFO, and some URLs are credentials: a webhook carries its secret in
    # the path, the query or as user:password@. Its failures still reach the log through our own lines.
    logging.getLogger("httpx").setLevel(max(numeric, logging.WARNING))
