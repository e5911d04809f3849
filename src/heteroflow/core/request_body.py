"""Bounded JSON request bodies: the size and nesting limits an HTTP service applies before it trusts a body.

Two pieces, neither importing a web framework:

- :func:`parse_json` — bytes in, a JSON value or a typed error out (purely computational), for a handler that
  reads its body itself.
- :class:`BodyLimit` — a plain ASGI middleware that reads the body once, refuses it when it is too large, nested
  too deeply, or declared JSON but undecodable, and otherwise hands the same bytes on, so that a framework's own
  body parsing never sees a hostile body (FastAPI answers an undecodable one with a generic 400 in its own
  shape). Each service renders the refusal in its own error shape (``render``).

Errors::

    BodyError (ValueError)
    ├── BodyTooLargeError      413  more than ``max_bytes`` (declared by Content-Length, or received)
    ├── BodyTimeoutError       408  the body did not arrive within ``read_timeout_sec`` (a slow sender is cut off)
    └── InvalidJsonBodyError   400  nested deeper than ``max_depth``; declared JSON but not UTF-8 (or -16, -32);
                                    NaN or Infinity (not JSON, and not writable back as JSON); a string with a
                                    lone surrogate escape (``"\\ud800"``: text no encoder can write)

Why a depth limit at all: CPython's decoder recurses once per level and gives up with ``RecursionError``
somewhere below a thousand levels, and every later consumer (pydantic, our own walkers, an engine) recurses
again. No request of ours nests more than a handful of levels, so anything deeper is refused at the door.

How the depth is measured: never by parsing and walking the value in Python (a megabyte of small containers
costs about a second of event loop that way). :func:`exceeds_depth` removes the JSON strings with one regular
expression, keeps only the brackets, and deletes innermost pairs ``max_depth`` times with ``bytes.replace`` —
every step runs in C, and a megabyte costs milliseconds.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, ClassVar, Final

from heteroflow.core.authentication import header

MAX_BODY_BYTES: Final = 1 << 20
"""Largest request body, bytes (1 MiB): the controller's limit, shared by every service that had none."""

MAX_JSON_DEPTH: Final = 32
"""Deepest nesting of arrays and objects accepted (``{}`` is 1, ``{"a": []}`` is 2)."""

BODY_READ_TIMEOUT_SEC: Final = 10.0
"""Longest time a request body may take to arrive, seconds: a client that sends a heartbeat one byte at a time
holds a connection (and, once authenticated, an admission slot) for no longer than this."""

CLEAN_TEXT: Final = "heteroflow.body_text_clean"
"""Request state key, set by :class:`BodyLimit` when :func:`check_body` found the body clean text: no string in
it holds a refused character (:func:`heteroflow.core.text.text_problem`)."""

Message = MutableMapping[str, Any]
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class BodyError(ValueError):
    """A request body refused before it was used; ``status`` and ``code`` are its HTTP answer."""

    status: ClassVar[int] = 400
    code: ClassVar[str] = "invalid_body"


class BodyTooLargeError(BodyError):
    status = 413
    code = "body_too_large"


class BodyTimeoutError(BodyError):
    status = 408
    code = "body_timeout"


class InvalidJsonBodyError(BodyError):
    status = 400
    code = "invalid_body"


_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_ALL_BYTES = bytes(range(256))
_NOT_BRACKETS = bytes(b for b in _ALL_BYTES if b not in b"[]{}")
_SQUARE = bytes.maketrans(b"{}", b"[]")


def exceeds_depth(raw: bytes, *, max_depth: int = MAX_JSON_DEPTH) -> bool:
    """Whether the JSON text ``raw`` (UTF-8) nests arrays and objects deeper than ``max_depth``, or has more
    brackets than that which do not balance. Purely computational, without parsing: C-speed on a megabyte.

    Strings are removed first (their brackets are text); then only the brackets are kept, as ``[]``; each
    ``replace`` of ``[]`` by nothing removes exactly one level (the pairs it removes are the innermost ones, and
    a pair that removal makes adjacent waits for the next pass).
    """
    if raw.count(b"[") + raw.count(b"{") <= max_depth:
        return False  # too few brackets to nest that deep: the common small body costs two byte counts
    text = _JSON_STRING.sub(b"", raw) if b'"' in raw else raw
    brackets = text.translate(_SQUARE, delete=_NOT_BRACKETS)
    for _ in range(max_depth):
        shorter = brackets.replace(b"[]", b"")
        if not shorter:
            return False
        if len(shorter) == len(brackets):
            return True  # no pair left to remove: the brackets do not balance
        brackets = shorter
    return bool(brackets)


_ESCAPED_BACKSLASH = re.compile(rb"\\\\")
_SURROGATE_PAIR = re.compile(rb"\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}")
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_NON_JSON_NUMBER = re.compile(rb"NaN|Infinity")
_PLAIN_BYTES = bytes(range(0x20, 0x5C)) + bytes(range(0x5D, 0x7F))
"""Printable ASCII but the backslash (the start of every escape): a body of these bytes alone is plain text.
Deleting them (``bytes.translate``) leaves what is not plain: a table lookup per byte, where a regular expression
search for the rest was ~10 times slower on a heartbeat's 3.4 KB."""


def text_problem(raw: bytes) -> str | None:
    """Why the JSON text ``raw`` (UTF-8) holds something no JSON writer can write back, or ``None``: a bare
    ``NaN``/``Infinity`` (Python's decoder accepts them, every encoder of ours refuses them), or a string with a
    lone surrogate escape (decoded, it cannot be encoded as UTF-8: a log line, a database row or an answer that
    echoes it fails). Purely computational; regular expressions only, so C-speed on a megabyte."""
    if _NON_JSON_NUMBER.search(raw):  # only then are the strings removed: the word may be text
        outside = _JSON_STRING.sub(b"", raw) if b'"' in raw else raw
        if _NON_JSON_NUMBER.search(outside):
            return "NaN and Infinity are not JSON numbers"
    if b"\\u" in raw:
        escapes = _SURROGATE_PAIR.sub(b"", _ESCAPED_BACKSLASH.sub(b"", raw))
        if _SURROGATE.search(escapes):
            return "a string holds a lone UTF-16 surrogate (\\ud800-\\udfff), which is not text"
    return None


def _as_utf8(raw: bytes) -> bytes | None:
    """``raw`` as UTF-8: itself, or decoded from the UTF-16/32 that JSON allows; ``None`` when not decodable."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        pass
    else:
        return raw
    try:
        return raw.decode(json.detect_encoding(raw)).encode("utf-8", "surrogatepass")
    except (UnicodeDecodeError, LookupError):
        return None


def nesting_depth(value: object, *, limit: int = MAX_JSON_DEPTH) -> int:
    """Nesting depth of a parsed JSON value (0 for a scalar), or ``limit + 1`` as soon as it is deeper.

    Iterative, so a value too deep for recursion is measured without recursing. A Python walk: for a value
    already parsed and small; a request body's depth is checked on its bytes by :func:`exceeds_depth`.
    """
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > limit:
            return limit + 1
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return deepest


def check_size(length: int, *, max_bytes: int = MAX_BODY_BYTES) -> None:
    if length > max_bytes:
        raise BodyTooLargeError(f"the request body is larger than {max_bytes} bytes")


def parse_json(raw: bytes, *, max_bytes: int = MAX_BODY_BYTES, max_depth: int = MAX_JSON_DEPTH) -> object:
    """The JSON value of ``raw``; :class:`BodyTooLargeError` or :class:`InvalidJsonBodyError` otherwise."""
    check_size(len(raw), max_bytes=max_bytes)
    text = _as_utf8(raw)
    if text is None:
        raise InvalidJsonBodyError("the request body is not JSON: not UTF-8 (or -16, -32) encoded")
    if exceeds_depth(text, max_depth=max_depth):
        raise InvalidJsonBodyError(f"the request body is nested deeper than {max_depth} levels")
    problem = text_problem(text)
    if problem is not None:
        raise InvalidJsonBodyError(f"the request body is not JSON: {problem}")
    try:
        return json.loads(text)
    except RecursionError as exc:
        raise InvalidJsonBodyError(f"the request body is nested deeper than {max_depth} levels") from exc
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError alike
        raise InvalidJsonBodyError(f"the request body is not JSON: {exc}") from exc


def check_body(
    raw: bytes,
    *,
    max_bytes: int = MAX_BODY_BYTES,
    max_depth: int = MAX_JSON_DEPTH,
    declared_json: bool = False,
    strict_text: bool = True,
) -> bool:
    """Refuse a body that is too large, JSON nested too deeply, or declared JSON but not text in a JSON encoding
    or (``strict_text``) holding what no JSON writer can write back (:func:`text_problem`); any other body
    passes (its route judges it, malformed JSON included). Nothing is parsed here.

    True when the body is plain text: printable ASCII only, without a backslash. No string decoded from it can
    hold a control character, a bidirectional control or a surrogate (:func:`heteroflow.core.text.text_problem`),
    so a route that judges such values one by one may skip that."""
    check_size(len(raw), max_bytes=max_bytes)
    text = _as_utf8(raw)
    if text is None:
        if declared_json:
            raise InvalidJsonBodyError("the request body is not UTF-8 encoded JSON")
        return False  # not text: not JSON either, so its depth means nothing; the route judges it
    if exceeds_depth(text, max_depth=max_depth):
        raise InvalidJsonBodyError(f"the request body is nested deeper than {max_depth} levels")
    if declared_json and strict_text:
        problem = text_problem(text)
        if problem is not None:
            raise InvalidJsonBodyError(f"the request body is not JSON: {problem}")
    return not text.translate(None, _PLAIN_BYTES)


Render = Callable[[str, BodyError], dict[str, object]]
"""A service's error body for a refused request body: ``(path, error) → JSON object``."""


class _Watched:
    __slots__ = ("deadline", "expired")

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.expired = False


class ReadDeadlines:
    """The deadlines of the bodies being read in one event loop, kept by one timer that fires every
    ``period_sec`` while any is watched: a task past its deadline is marked ``expired`` and cancelled. A deadline
    is kept to within one period; watching a read costs a dictionary entry, not a timer of its own."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, period_sec: float) -> None:
        self.loop = loop
        self.period_sec = period_sec
        self._watched: dict[asyncio.Task[Any], _Watched] = {}
        self._timer: asyncio.TimerHandle | None = None

    def watch(self, task: asyncio.Task[Any], deadline: float) -> _Watched:
        watched = self._watched[task] = _Watched(deadline)
        if self._timer is None:
            self._timer = self.loop.call_at(self.loop.time() + self.period_sec, self._sweep)
        return watched

    def forget(self, task: asyncio.Task[Any]) -> None:
        self._watched.pop(task, None)

    def __len__(self) -> int:
        """Reads being watched."""
        return len(self._watched)

    @property
    def armed(self) -> bool:
        """Whether the sweep timer is set (only while a read is watched, or until the sweep after the last)."""
        return self._timer is not None

    def _sweep(self) -> None:
        self._timer = None
        now = self.loop.time()
        for task, watched in [(task, watched) for task, watched in self._watched.items() if watched.deadline <= now]:
            del self._watched[task]
            watched.expired = True
            task.cancel()
        if self._watched:  # only while something is read: an idle loop keeps no timer
            self._timer = self.loop.call_at(now + self.period_sec, self._sweep)


class BodyLimit:
    """ASGI middleware: every HTTP request body is read here first and refused when :func:`check_body` says so.

    A Content-Length over the limit is answered at once, without reading; a body sent without one is cut off
    as soon as it passes the limit; a body still arriving after ``read_timeout_sec`` is answered 408 (the slow
    sender's connection is closed). An accepted body is handed to the application unchanged, in one message.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        render: Render,
        max_bytes: int = MAX_BODY_BYTES,
        max_depth: int = MAX_JSON_DEPTH,
        read_timeout_sec: float = BODY_READ_TIMEOUT_SEC,
        too_large_status: int = BodyTooLargeError.status,
        strict_text: Callable[[Scope], bool] | None = None,
        applies: Callable[[Scope], bool] | None = None,
        strict_length: bool = False,
    ) -> None:
        self.app = app
        self.strict_length = strict_length
        """Whether a Content-Length that is not a length is refused 400 (otherwise the bytes are counted): for a
        service that forwards the body to another server, which might read the header differently."""
        self.applies = applies
        """Which requests have their body read here (default every one): a service whose other routes read no
        body, or check their credential only in the route, leaves those to the route."""
        self.render = render
        self.max_bytes = max_bytes
        self.max_depth = max_depth
        self.read_timeout_sec = read_timeout_sec
        self.too_large_status = too_large_status
        """413, or 400 where a service's contract answers every refused body 400 (the controller's)."""
        self.strict_text = strict_text
        """Which requests have their text checked (:func:`text_problem`; default every one). A route that
        refuses bad values one by one (a heartbeat: a bad reading must not cost the beat) opts out."""
        self.deadlines: ReadDeadlines | None = None
        """The read deadlines of the loop this middleware last served in (one per loop)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (self.applies is not None and not self.applies(scope)):
            await self.app(scope, receive, send)
            return
        try:
            body = await self._read_within_deadline(scope, receive)
            if body is None:
                return  # the client went away before its body ended: there is no one to answer
            clean = check_body(
                body,
                max_bytes=self.max_bytes,
                max_depth=self.max_depth,
                declared_json=_declares_json(scope),
                strict_text=self.strict_text is None or self.strict_text(scope),
            )
        except BodyError as exc:
            await self._refuse(scope, send, exc)
            return
        if clean:
            scope.setdefault("state", {})[CLEAN_TEXT] = True
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # later calls wait for the disconnect, as a streaming response expects

        await self.app(scope, replay, send)

    async def _read_within_deadline(self, scope: Scope, receive: Receive) -> bytes | None:
        """:meth:`_read`, cut off once ``read_timeout_sec`` has passed (:class:`BodyTimeoutError`), at most a
        :class:`ReadDeadlines` period later.

        What ``asyncio.timeout`` does, for this one use: the reading task is cancelled when its deadline passes,
        and a cancellation is turned into the timeout only when the deadline caused it (a cancellation from
        outside stays one). One timer watches every body being read (:class:`ReadDeadlines`) instead of a timer
        made and cancelled per request (about 3 % of a steady heartbeat's CPU in a profile), for a body that is
        nearly always there at once."""
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        if task is None:  # pragma: no cover - an ASGI server always runs the app in a task
            return await self._read(scope, receive)
        deadlines = self.deadlines
        if deadlines is None or deadlines.loop is not loop:
            deadlines = self.deadlines = ReadDeadlines(loop, period_sec=min(1.0, self.read_timeout_sec / 4))
        cancelling = task.cancelling()
        watched = deadlines.watch(task, loop.time() + self.read_timeout_sec)
        try:
            body = await self._read(scope, receive)
        except asyncio.CancelledError as exc:
            if watched.expired and task.uncancel() <= cancelling:
                raise BodyTimeoutError(
                    f"the request body did not arrive within {self.read_timeout_sec:g} s; send it at once"
                ) from exc
            raise
        finally:
            deadlines.forget(task)
        if watched.expired:  # the deadline's cancellation was swallowed on the way: withdrawn, as asyncio.timeout does
            task.uncancel()
        return body

    async def _read(self, scope: Scope, receive: Receive) -> bytes | None:
        declared = _content_length(scope)
        if declared is None and self.strict_length and header(scope, b"content-length") is not None:
            raise InvalidJsonBodyError("the Content-Length header is not a number")
        if declared is not None:
            check_size(declared, max_bytes=self.max_bytes)
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            check_size(size, max_bytes=self.max_bytes)
            parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts)

    async def _refuse(self, scope: Scope, send: Send, exc: BodyError) -> None:
        payload = json.dumps(self.render(str(scope.get("path", "")), exc)).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
        if isinstance(exc, BodyTooLargeError | BodyTimeoutError):
            headers.append((b"connection", b"close"))  # the rest of the body is never read
        status = self.too_large_status if isinstance(exc, BodyTooLargeError) else exc.status
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload, "more_body": False})


def _declares_json(scope: Scope) -> bool:
    """``Content-Type: application/json`` or ``application/…+json``, as FastAPI decides to parse a body."""
    value = header(scope, b"content-type")
    if value is None:
        return False
    media_type = value.decode("latin-1").split(";", 1)[0].strip().lower()
    return media_type == "application/json" or (media_type.startswith("application/") and media_type.endswith("+json"))


def _content_length(scope: Scope) -> int | None:
    value = header(scope, b"content-length")
    if value is None:
        return None
    text = value.decode("latin-1").strip()
    if not (text.isascii() and text.isdigit()):
        return None  # not a length: the bytes received are counted instead
    # int() refuses strings of thousands of digits; anything past 18 digits is too large anyway
    return int(text) if len(text) <= 18 else 10**18
