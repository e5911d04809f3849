"""What a failed command prints: one line saying what failed and what to check, exit code 2.

The failures an operator causes and fixes — a database that cannot be reached or refuses the connection, a URL
that is not one, a file that is missing or cannot be read, a peer that does not answer — are told in one line on
stderr; the traceback is for ``--debug`` (or ``HETEROFLOW_DEBUG=1``). Anything else is a fault of the program and
keeps its traceback.

The exception classes are looked up in the modules already imported, never imported here: a command that never
touched the database has no database error to translate, and does not pay for importing SQLAlchemy.
"""

from __future__ import annotations

import os
import sys
from typing import Final
from urllib.parse import urlsplit

from typer._click.exceptions import NoArgsIsHelpError, UsageError  # the click that typer vendors

from heteroflow.core.errors import StoreUnavailableError

FAILED_EXIT_CODE: Final = 2
"""The exit code of a command that failed on what it was given or could not reach (click's usage errors use it too)."""

DEBUG_ENV: Final = "HETEROFLOW_DEBUG"
"""Set to 1 (or pass ``--debug``) for the traceback instead of the one line."""

_DATABASE_CHECK: Final = (
    "check that the database runs, its host, port and credentials (--database-url or HETEROFLOW_DATABASE_URL)"
)
_PEER_CHECK: Final = "check the URL and that the service runs there"


def debug_requested(flag: bool) -> bool:
    """Whether the traceback is wanted: ``--debug`` or ``HETEROFLOW_DEBUG`` set to 1/true/yes."""
    return flag or os.environ.get(DEBUG_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def http_url_problem(url: str) -> str | None:
    """Why ``url`` cannot name an HTTP service (scheme ``http``/``https`` and a host), or ``None`` when it can.

    A peer's URL is checked when the command starts: a process that retried a URL that can never work, with a
    back-off, would look like a peer that is away."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number in range
    except ValueError as exc:
        return f"{url!r} is not a URL ({exc})"
    if parts.scheme not in {"http", "https"}:
        return f"{url!r} is not an http:// or https:// URL"
    if not parts.hostname:
        return f"{url!r} names no host"
    return None


def _instance_of(exc: BaseException, module: str, *names: str) -> bool:
    loaded = sys.modules.get(module)
    if loaded is None:
        return False
    classes = tuple(cls for cls in (getattr(loaded, name, None) for name in names) if isinstance(cls, type))
    return bool(classes) and isinstance(exc, classes)


def _first_line(value: object) -> str:
    lines = [line.strip() for line in str(value).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(value).__name__


def one_line(exc: BaseException) -> str | None:
    """The one line for a failure the operator can fix, or ``None`` for one that keeps its traceback."""
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return one_line(exc.exceptions[0])
    if isinstance(exc, NoArgsIsHelpError):
        return None  # not a failure: the group prints its help
    if isinstance(exc, UsageError):
        command = exc.ctx.command_path if exc.ctx is not None else "heteroflow"
        return f"{exc.format_message()} (see `{command} --help`)"
    if _instance_of(exc, "heteroflow.storage.db", "DatabaseUrlError"):
        return f"bad database URL: {exc}; check --database-url or HETEROFLOW_DATABASE_URL"
    if _instance_of(exc, "sqlalchemy.exc", "ArgumentError"):
        return f"bad database URL: {_first_line(exc)}; check --database-url or HETEROFLOW_DATABASE_URL"
    if _instance_of(exc, "sqlalchemy.exc", "OperationalError", "InterfaceError", "TimeoutError"):
        origin = getattr(exc, "orig", None) or exc
        return f"cannot use the database: {_first_line(origin)}; {_DATABASE_CHECK}"
    if _instance_of(exc, "psycopg", "OperationalError", "InterfaceError"):
        return f"cannot use the database: {_first_line(exc)}; {_DATABASE_CHECK}"
    if isinstance(exc, StoreUnavailableError):
        return f"cannot use the database: {_first_line(exc)}; {_DATABASE_CHECK}"
    if _instance_of(exc, "httpx", "InvalidURL", "UnsupportedProtocol"):
        return f"bad URL: {_first_line(exc)}; check the URL given (scheme http:// or https://, host, port)"
    if _instance_of(exc, "httpx", "TransportError"):
        where = _request_url(exc)
        return f"cannot reach {where}: {_first_line(exc)}; {_PEER_CHECK}"
    if isinstance(exc, OSError) and exc.filename is not None:
        reason = exc.strerror or _first_line(exc)
        return f"cannot use the file {exc.filename}: {reason}; check the path and its permissions"
    if isinstance(exc, ConnectionError):
        return f"connection failed: {exc.strerror or _first_line(exc)}; {_PEER_CHECK}"
    return None


def _request_url(exc: BaseException) -> str:
    try:
        request = exc.request  # type: ignore[attr-defined]  # httpx raises RuntimeError when it has none
    except (AttributeError, RuntimeError):
        return "the service"
    return str(request.url)
