"""Forwarding of OpenAI requests to published endpoints: hold, re-route and resume (``serving-ft.md`` F-41).

A request that has sent nothing to its client is never answered with an error because an engine is faulted,
withdrawn or rebuilding, as long as its client deadline (``client_deadline_sec``, 30 s) lasts:

1. Take a lease on the best published endpoint of the model (:meth:`ServingViews.acquire`): fewest in flight,
   skipping endpoints that just answered with a fault, preferring instances this request has not met a fault
   on. With none, *hold*: wait for a publication (or for a fault pause to pass) until the client deadline,
   then 503 with ``Retry-After``.
2. Right before the request headers are written, the lease is checked once more under the views' lock
   (httpx's ``trace`` request extension, :meth:`Forwarder._tracer`): an endpoint withdrawn since it was chosen
   is never sent anything, and the request chooses again (not a failure).
3. Fault answers send the request elsewhere (step 1 again, the failed endpoint excluded until it is published
   again or its fault pause passed): HTTP 503, and any other 5xx (vLLM answers 500 when its engine core died
   or failed a request: the engine's fault, never the client's); a non-streaming 200 with a choice that ended
   ``finish_reason: "abort"`` (a released vLLM's aborted request, with or without the text it had made); a
   transport failure (refused, reset, closed, timed out); a stream that ends, errs or aborts before its first
   output; and no answer within ``faulted_first_byte_sec`` once the endpoint was reported faulted (a DEL with
   ``faulted``: :meth:`Forwarder.faulted`).
4. Other upstream answers (2xx, 4xx) are passed through unchanged: a 4xx is the client's problem. No engine
   5xx ever reaches the client: past the client deadline the answer is 503 with ``Retry-After``.
5. Non-streaming answers are buffered, so "sent nothing" lasts until the whole answer is in. A stream is held
   back until its first event with output, then relayed event by event. If it is cut after that (transport
   failure, an error event, ``abort``, a stall after a fault report), it is *resumed* on a survivor by a
   continuation request (:mod:`.streams`) and spliced so that the client sees one stream; where that cannot
   apply (``n > 1``, logprobs, …) or no survivor answers within the client deadline, it ends with
   ``data: {"error": {...}}`` and ``data: [DONE]`` instead of hanging or cutting an event.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import httpx
import structlog
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send
from structlog.typing import FilteringBoundLogger

from heteroflow.serving.coordinator.body import InferenceRequest
from heteroflow.serving.coordinator.errors import (
    CoordinatorError,
    NoEndpointError,
    UpstreamUnavailableError,
    openai_error_body,
)
from heteroflow.serving.coordinator.metrics import CoordinatorMetrics
from heteroflow.serving.coordinator.streams import DONE, Event, StreamContext, is_abort_answer, split_event
from heteroflow.serving.coordinator.views import EndpointKey, Lease, ServingViews

_log = structlog.get_logger(__name__)

FailureReason = Literal[
    "connect", "timeout", "disconnect", "upstream_503", "upstream_5xx", "abort", "error_event", "faulted_stall"
]


_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
     "transfer-encoding", "upgrade"}
)  # fmt: skip
_NOT_FORWARDED = _HOP_BY_HOP | {"host", "authorization", "content-length", "cookie", "accept-encoding", "x-request-id"}
ENDPOINT_HEADER = "x-heteroflow-endpoint"
"""Names the ``instance/endpoint`` whose engine answered (added to every engine answer, for tracing a request)."""
_NOT_RETURNED = _HOP_BY_HOP | {"content-length", "date", "server", ENDPOINT_HEADER}


@dataclass(frozen=True, slots=True)
class UpstreamTimeouts:
    """Seconds: TCP connect; response headers and each later chunk; one whole request, retry included."""

    connect: float = 2.0
    first_byte: float = 60.0
    total: float = 600.0

    def httpx(self) -> httpx.Timeout:
        return httpx.Timeout(connect=self.connect, read=self.first_byte, write=self.first_byte, pool=self.first_byte)


class PublicationSignal:
    """Wakes the requests that wait for a publication; take :meth:`current` before looking at the views."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._waiting = 0

    @property
    def waiting(self) -> int:
        """Requests waiting now for a publication (their model has no published endpoint)."""
        return self._waiting

    def current(self) -> asyncio.Event:
        return self._event

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, seen: asyncio.Event, *, within: float) -> None:
        """Return at the first publication after ``seen`` was taken, or after ``within`` seconds."""
        self._waiting += 1
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(within):
                    await seen.wait()
        finally:
            self._waiting -= 1


class _WithdrawnBeforeSendError(Exception):
    """The chosen endpoint was withdrawn before the request headers were written; nothing was sent."""


class _AttemptFailedError(Exception):
    def __init__(self, reason: FailureReason, detail: str, *, suspect: bool = True) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.suspect = suspect
        """Skip the endpoint for every request for the fault pause. Not for a timeout: an engine slow to accept
        or answer under load is busy, not faulted, and pausing it for everyone would only make the rest busier."""


def _reason_of(exc: httpx.HTTPError) -> FailureReason:
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.UnsupportedProtocol):
        return "connect"
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    return "disconnect"


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def upstream_headers(
    client_headers: Iterable[tuple[str, str]], *, request_id: str, token: str | None, stream: bool
) -> dict[str, str]:
    """What the engine gets: the client's headers minus hop-by-hop ones and its credentials.

    The client's API key is never forwarded (the engine trusts the cluster token instead), and a streamed
    answer is asked uncompressed so that it can be cut at event boundaries.
    """
    given = list(client_headers)
    out = {name: value for name, value in given if name.lower() not in _NOT_FORWARDED}
    encoding = next((value for name, value in given if name.lower() == "accept-encoding"), "identity")
    out["accept-encoding"] = "identity" if stream else encoding
    out["x-request-id"] = request_id
    if token:
        out["authorization"] = f"Bearer {token}"
    return out


def returned_headers(upstream: httpx.Headers, *, decoded: bool, answered_by: EndpointKey) -> dict[str, str]:
    """What the client gets: the engine's headers minus hop-by-hop ones, plus which endpoint answered."""
    drop = _NOT_RETURNED | ({"content-encoding"} if decoded else frozenset())
    kept = {name: value for name, value in upstream.multi_items() if name.lower() not in drop}
    # header values are latin-1 on the wire: ids the controller chose may not be
    kept[ENDPOINT_HEADER] = answered_by.label.encode("ascii", "backslashreplace").decode("ascii")
    return kept


def last_event_end(buffer: bytes) -> int:
    """Length of the prefix of ``buffer`` that holds only complete SSE events (0 if none ends yet)."""
    ends = [buffer.rfind(separator) + len(separator) for separator in (b"\n\n", b"\r\n\r\n") if separator in buffer]
    return max(ends, default=0)


def stream_error_event(message: str, *, code: int = 502) -> bytes:
    body = openai_error_body(status_code=code, kind="BadGatewayError", message=message)
    return b"data: " + json.dumps(body).encode("utf-8") + b"\n\n" + DONE


@dataclass(eq=False)
class _Watch:
    """One attempt's time bound, which a fault report on its endpoint shortens (:meth:`Forwarder.faulted`)."""

    scope: asyncio.Timeout
    stalled: bool = False


@dataclass(eq=False)
class _Segment:
    """One engine's stream, opened and read up to (and including) its first event that carries output."""

    lease: Lease
    response: httpx.Response
    events: _EventReader
    buffered: list[Event]
    ended: bool = False
    """The engine's stream already ended (``[DONE]`` among the buffered events)."""


class _EventReader:
    """SSE events from a chunk iterator, one at a time; a partial event at the end of the stream is dropped."""

    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        self._chunks = chunks
        self._buffer = b""

    async def next(self) -> Event | None:
        while True:
            cut = split_event(self._buffer)
            if cut:
                raw, self._buffer = self._buffer[:cut], self._buffer[cut:]
                return Event.parse(raw)
            chunk = await anext(self._chunks, None)
            if chunk is None:
                return None
            self._buffer += chunk


class Forwarder:
    """Sends requests to the engines; see the module docstring for the rules."""

    def __init__(
        self,
        *,
        views: ServingViews,
        client: httpx.AsyncClient,
        timeouts: UpstreamTimeouts,
        client_deadline_sec: float,
        retry_after_sec: int,
        upstream_token: str | None,
        metrics: CoordinatorMetrics,
        publications: PublicationSignal,
        faulted_first_byte_sec: float = 1.0,
        fault_pause_sec: float = 1.0,
    ) -> None:
        self._views = views
        self._client = client
        self._timeouts = timeouts
        self._hold = client_deadline_sec
        self._retry_after = retry_after_sec
        self._token = upstream_token
        self._metrics = metrics
        self._publications = publications
        self._faulted_bound = faulted_first_byte_sec
        self._pause = fault_pause_sec
        self._sending: dict[Lease, asyncio.Event] = {}
        self._watches: dict[tuple[str, int], set[_Watch]] = {}
        self._faulted_at: dict[tuple[str, int], float] = {}
        """When each endpoint was last reported faulted: a read that starts later, while the endpoint is still
        withdrawn, gets the bound from that moment (a report between two reads is never lost)."""

    async def wait_sent(self, leases: Sequence[Lease], *, within: float) -> bool:
        """Wait until these leases have written their request headers (or given up); False on timeout."""
        events = [self._sending[lease] for lease in leases if lease in self._sending]
        try:
            async with asyncio.timeout(within):
                for event in events:
                    await event.wait()
        except TimeoutError:
            return False
        return True

    def faulted(self, instance_id: str, endpoint_ids: Iterable[int]) -> int:
        """These endpoints were reported faulted: every attempt on them still waiting for its engine gets at
        most the faulted first-byte bound from now. Returns how many attempts were shortened."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        bound = now + self._faulted_bound
        shortened = 0
        for endpoint_id in endpoint_ids:
            self._faulted_at[(instance_id, endpoint_id)] = now
            for watch in self._watches.get((instance_id, endpoint_id), ()):
                when = watch.scope.when()
                if when is None or when > bound:
                    watch.scope.reschedule(bound)
                    watch.stalled = True
                    shortened += 1
        return shortened

    async def forward(
        self, *, route: str, path: str, request: InferenceRequest, headers: Iterable[tuple[str, str]], request_id: str
    ) -> Response:
        """The engine's answer (or a relay of it); raises a 5xx :class:`CoordinatorError` when there is none."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        deadline = now + self._timeouts.total
        log = _log.bind(request_id=request_id, model=request.model, route=route)
        sent_headers = upstream_headers(headers, request_id=request_id, token=self._token, stream=request.stream)
        found = await self._send(
            request.model, path, request.raw, sent_headers, stream=request.stream,
            hold_until=min(now + self._hold, deadline), deadline=deadline, log=log, route=route,
        )  # fmt: skip
        if isinstance(found, Response):
            return found
        context = StreamContext(route=route, body=_parsed(request.raw))
        return _RelayResponse(
            events=self._relay(found, context, path=path, headers=sent_headers, model=request.model, route=route,
                               deadline=deadline, log=log),
            status_code=200,
            headers=returned_headers(found.response.headers, decoded=True, answered_by=found.lease.key),
        )  # fmt: skip

    # -- choosing, holding and re-routing -----------------------------------------------------------------
    async def _send(
        self,
        model: str,
        path: str,
        raw: bytes,
        headers: Mapping[str, str],
        *,
        stream: bool,
        hold_until: float,
        deadline: float,
        log: FilteringBoundLogger,
        route: str,
        cut_on: EndpointKey | None = None,
    ) -> Response | _Segment:
        """Send until an engine answers without a fault, re-routing and holding until ``hold_until``
        (``cut_on``: the endpoint whose stream was just cut, avoided like a failed attempt)."""
        loop = asyncio.get_running_loop()
        avoid: dict[EndpointKey, tuple[float, int]] = {}
        failures: list[tuple[EndpointKey, _AttemptFailedError]] = []
        if cut_on is not None:
            avoid[cut_on] = (loop.time() + self._pause, self._views.epoch(cut_on))
        while True:
            lease = await self._acquire(model, avoid=avoid, failures=failures, until=hold_until)
            if lease is None:
                raise self._gave_up(model, failures)
            attempt_log = log.bind(instance=lease.key.instance_id, endpoint=lease.key.endpoint_id)
            try:
                return await self._attempt(
                    lease, path=path, raw=raw, headers=headers, stream=stream, deadline=deadline, log=attempt_log,
                    route=route,
                )  # fmt: skip
            except _WithdrawnBeforeSendError:
                attempt_log.info("coordinator.withdrawn_before_send", address=_address(lease.key))
            except _AttemptFailedError as exc:
                now = loop.time()
                failures.append((lease.key, exc))
                epoch = self._views.epoch(lease.key)
                avoid[lease.key] = (now + self._pause, epoch)
                if exc.suspect:
                    self._views.suspect(lease.key, until=now + self._pause)
                self._metrics.retries.labels(reason=exc.reason).inc()
                attempt_log.warning(
                    "coordinator.upstream_failed",
                    address=_address(lease.key),
                    reason=exc.reason,
                    detail=exc.detail,
                    will_retry=now < hold_until,
                )
                if now >= hold_until:
                    raise self._gave_up(model, failures) from None

    async def _acquire(
        self,
        model: str,
        *,
        avoid: dict[EndpointKey, tuple[float, int]],
        failures: Sequence[tuple[EndpointKey, _AttemptFailedError]],
        until: float,
    ) -> Lease | None:
        """A lease on a published endpoint this request has not just met a fault on; waits for a publication
        (or for a fault pause to pass) up to ``until``."""
        loop = asyncio.get_running_loop()
        avoid_instances = frozenset(key.instance_id for key, _ in failures)
        while True:
            published = self._publications.current()  # before looking, so that no publication is missed
            now = loop.time()
            excluded = [key for key, (t, epoch) in avoid.items() if t > now and self._views.epoch(key) == epoch]
            lease = self._views.acquire(model, exclude=excluded, avoid_instances=avoid_instances, now=now)
            if lease is not None:
                return lease
            remaining = until - now
            if remaining <= 0:
                return None
            wakes = [t for key, (t, _) in avoid.items() if t > now]
            suspect = self._views.next_suspect_expiry(model, now)
            if suspect is not None:
                wakes.append(suspect)
            await self._publications.wait(published, within=min([remaining, *(t - now for t in wakes)]))

    def _gave_up(
        self, model: str, failures: Sequence[tuple[EndpointKey, _AttemptFailedError]]
    ) -> NoEndpointError | UpstreamUnavailableError:
        if not failures:
            message = f"no endpoint of model {model!r} is published (waited {self._hold:g} s); try again shortly"
            return NoEndpointError(message, retry_after=self._retry_after)
        named = "; ".join(f"endpoint {key.label} {exc.detail}" for key, exc in failures[-3:])
        more = f" (and {len(failures) - 3} earlier failures)" if len(failures) > 3 else ""
        message = (
            f"no engine of model {model!r} answered within the client deadline of {self._hold:g} s: {named}{more}; "
            "try again shortly"
        )
        return UpstreamUnavailableError(message, retry_after=self._retry_after)

    # -- one attempt --------------------------------------------------------------------------------------
    async def _attempt(
        self,
        lease: Lease,
        *,
        path: str,
        raw: bytes,
        headers: Mapping[str, str],
        stream: bool,
        deadline: float,
        log: FilteringBoundLogger,
        route: str,
    ) -> Response | _Segment:
        loop = asyncio.get_running_loop()
        response: httpx.Response | None = None
        handed_over = False
        watch: _Watch | None = None
        try:
            if not self._views.is_published(lease.key):
                raise _WithdrawnBeforeSendError
            upstream = self._client.build_request(
                "POST", lease.key.base_url + path, content=raw, headers=headers,
                extensions={"trace": self._tracer(lease)},
            )  # fmt: skip
            try:
                async with asyncio.timeout_at(deadline) as scope:
                    watch = self._watch(lease.key, scope)
                    started = loop.time()
                    response = await self._client.send(upstream, stream=True)
                    self._metrics.upstream_latency.labels(
                        instance=lease.key.instance_id, endpoint=str(lease.key.endpoint_id)
                    ).observe(loop.time() - started)
                    if response.status_code == 503:
                        detail = await self._error_detail(response)
                        raise _AttemptFailedError("upstream_503", f"answered 503 (engine unavailable: {detail})")
                    if response.status_code >= 500:
                        detail = await self._error_detail(response)
                        raise _AttemptFailedError(
                            "upstream_5xx", f"answered {response.status_code} (engine error: {detail})"
                        )
                    if stream and response.status_code == 200:
                        segment = await self._open(lease, response)
                        handed_over = True
                        return segment
                    body = await response.aread()
            except httpx.HTTPError as exc:
                raise _AttemptFailedError(
                    _reason_of(exc), f"failed ({_describe(exc)})", suspect=not isinstance(exc, httpx.TimeoutException)
                ) from exc
            except TimeoutError as exc:
                raise self._timed_out(watch) from exc
            finally:
                self._unwatch(lease.key, watch)
            if response.status_code == 200 and is_abort_answer(body):
                raise _AttemptFailedError("abort", "answered 200 with finish_reason 'abort' (an incomplete answer)")
            self._metrics.requests.labels(route=route, outcome=_outcome_of(response.status_code)).inc()
            log.debug("coordinator.forwarded", status=response.status_code)
            return Response(
                content=body,
                status_code=response.status_code,
                headers=returned_headers(response.headers, decoded=True, answered_by=lease.key),
            )
        finally:
            if not handed_over:
                try:
                    if response is not None:
                        await response.aclose()
                finally:
                    self._release(lease)

    async def _open(self, lease: Lease, response: httpx.Response) -> _Segment:
        """Read a stream up to its first event with output; a fault before that is the attempt's failure."""
        events = _EventReader(response.aiter_bytes())
        buffered: list[Event] = []
        while True:
            event = await events.next()
            if event is None:
                if any(e.finish_reasons for e in buffered):
                    return _Segment(lease, response, events, [*buffered, Event(DONE, done=True)], ended=True)
                raise _AttemptFailedError("disconnect", "closed the stream before sending any output")
            if event.error:
                raise _AttemptFailedError(
                    "error_event", f"sent an error event before any output ({_error_text(event)})"
                )
            if event.aborted and not event.text:
                raise _AttemptFailedError("abort", "ended the stream with finish_reason 'abort' before any output")
            buffered.append(event)
            if event.done:
                return _Segment(lease, response, events, buffered, ended=True)
            if event.text or event.tool_calls or event.finish_reasons:
                return _Segment(lease, response, events, buffered)

    def _watch(self, key: EndpointKey, scope: asyncio.Timeout) -> _Watch:
        watch = _Watch(scope)
        faulted_at = self._faulted_at.get((key.instance_id, key.endpoint_id))
        if faulted_at is not None:
            if self._views.is_published(key):  # published again since: the report is over
                del self._faulted_at[(key.instance_id, key.endpoint_id)]
            else:
                bound = faulted_at + self._faulted_bound
                when = scope.when()
                if when is None or when > bound:
                    scope.reschedule(bound)
                    watch.stalled = True
        self._watches.setdefault((key.instance_id, key.endpoint_id), set()).add(watch)
        return watch

    def _unwatch(self, key: EndpointKey, watch: _Watch | None) -> None:
        found = self._watches.get((key.instance_id, key.endpoint_id))
        if found is not None and watch is not None:
            found.discard(watch)
            if not found:
                del self._watches[(key.instance_id, key.endpoint_id)]

    def _timed_out(self, watch: _Watch | None) -> _AttemptFailedError:
        if watch is not None and watch.stalled:
            return _AttemptFailedError(
                "faulted_stall", f"was reported faulted and sent nothing within {self._faulted_bound:g} s"
            )
        return _AttemptFailedError(
            "timeout", f"did not answer within the total {self._timeouts.total:g} s", suspect=False
        )

    async def _error_detail(self, response: httpx.Response) -> str:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            body = json.loads(await response.aread())
            error = body.get("error") if isinstance(body, dict) else None
            message = error.get("message") if isinstance(error, dict) else error
            if isinstance(message, str) and message:
                return message[:300]
        return "no detail"

    def _tracer(self, lease: Lease) -> Callable[[str, Mapping[str, Any]], Awaitable[None]]:
        """httpcore's ``trace`` hook: the last check against the views sits right before the headers go out."""

        async def trace(event: str, _: Mapping[str, Any]) -> None:
            if event.endswith(".send_request_headers.started"):
                self._sending[lease] = asyncio.Event()
                if not self._views.begin_send(lease):
                    self._settle(lease)
                    raise _WithdrawnBeforeSendError
            elif event.endswith((".send_request_headers.complete", ".send_request_headers.failed")):
                self._views.mark_sent(lease)
                self._settle(lease)

        return trace

    def _settle(self, lease: Lease) -> None:
        event = self._sending.pop(lease, None)
        if event is not None:
            event.set()

    def _release(self, lease: Lease) -> None:
        self._views.release(lease)
        self._settle(lease)

    # -- streaming: relay, and continuation of a cut stream -----------------------------------------------
    async def _relay(
        self,
        segment: _Segment,
        context: StreamContext,
        *,
        path: str,
        headers: Mapping[str, str],
        model: str,
        route: str,
        deadline: float,
        log: FilteringBoundLogger,
    ) -> AsyncGenerator[bytes, None]:
        """The client's stream: the engine's events, and after a cut, the continuation's, spliced."""
        loop = asyncio.get_running_loop()
        outcome = "client_gone"
        current: _Segment | None = segment
        try:
            while current is not None:
                cut = ""
                async for piece, problem in self._events_of(current, context, deadline):
                    if piece is not None:
                        yield piece
                    if problem is not None:
                        cut = problem
                if not cut:
                    outcome = "ok" if context.segments == 1 else "resumed"
                    return
                cut_on = current.lease.key
                self._views.suspect(cut_on, until=loop.time() + self._pause)
                await self._close(current)
                current = None
                log.warning("coordinator.stream_cut", detail=cut, sent_events=context.text_events)
                why_not = context.why_not_continuable()
                if why_not is not None:
                    self._metrics.continuations.labels(outcome="not_continuable").inc()
                    outcome = "stream_error"
                    yield stream_error_event(
                        f"the engine failed while streaming ({cut}); the answer is incomplete and cannot be resumed "
                        f"elsewhere because {why_not}"
                    )
                    return
                remaining = context.remaining_tokens()
                if remaining is not None and remaining <= 0:
                    self._metrics.continuations.labels(outcome="completed").inc()
                    outcome = "resumed"
                    yield context.final_events()
                    return
                now = loop.time()
                try:
                    found = await self._send(
                        model, path, context.continuation(remaining), headers, stream=True,
                        hold_until=min(now + self._hold, deadline), deadline=deadline, log=log, route=route,
                        cut_on=cut_on,
                    )  # fmt: skip
                except CoordinatorError as exc:
                    self._metrics.continuations.labels(outcome="failed").inc()
                    outcome = "stream_error"
                    yield stream_error_event(
                        f"the engine failed while streaming ({cut}) and the stream could not be resumed: {exc.message}",
                        code=exc.status_code,
                    )
                    return
                assert isinstance(found, _Segment)
                self._metrics.continuations.labels(outcome="resumed").inc()
                context.segments += 1
                current = found
                log.info("coordinator.stream_resumed", instance=found.lease.key.instance_id,
                         endpoint=found.lease.key.endpoint_id, segment=context.segments)  # fmt: skip
        finally:
            if current is not None:
                await self._close(current)
            self._metrics.requests.labels(route=route, outcome=outcome).inc()

    async def _events_of(
        self, segment: _Segment, context: StreamContext, deadline: float
    ) -> AsyncGenerator[tuple[bytes | None, str | None], None]:
        """``(bytes for the client, why the stream was cut)`` per event of one segment; a cut ends it."""
        first = context.segments == 1
        for event in segment.buffered:
            if event.done and not context.finished:
                yield None, "the engine ended the stream without a finish_reason"
                return
            yield self._relayed(event, context, first=first), None
            if event.done:
                return
        if segment.ended:
            return
        while True:
            watch: _Watch | None = None
            try:
                async with asyncio.timeout_at(deadline) as scope:
                    watch = self._watch(segment.lease.key, scope)
                    found = await segment.events.next()
            except httpx.HTTPError as exc:
                yield None, _describe(exc)
                return
            except TimeoutError:
                yield None, self._timed_out(watch).detail
                return
            finally:
                self._unwatch(segment.lease.key, watch)
            if found is None:
                if context.finished:  # a finish was relayed: the stream is complete but for its [DONE]
                    yield DONE, None
                    return
                yield None, "the engine closed the stream before it finished"
                return
            event = found
            if event.error:
                yield None, f"an error event: {_error_text(event)}"
                return
            if event.aborted:
                yield None, "finish_reason 'abort'"
                return
            if event.done and not context.finished:  # an incomplete answer, never relayed as complete
                yield None, "the engine ended the stream without a finish_reason"
                return
            yield self._relayed(event, context, first=first), None
            if event.done:
                return

    @staticmethod
    def _relayed(event: Event, context: StreamContext, *, first: bool) -> bytes | None:
        data = event.raw if first else context.splice(event)
        if data is not None:
            context.note(event)
        return data

    async def _close(self, segment: _Segment) -> None:
        try:
            await segment.response.aclose()
        finally:
            self._release(segment.lease)


def _parsed(raw: bytes) -> dict[str, Any] | None:
    with contextlib.suppress(ValueError):
        body = json.loads(raw)
        return body if isinstance(body, dict) else None
    return None


def _error_text(event: Event) -> str:
    error = event.payload.get("error") if event.payload is not None else None
    message = error.get("message") if isinstance(error, dict) else error
    return str(message)[:200] if message else "no detail"


def _address(key: EndpointKey) -> str:
    return f"{key.ip}:{key.port}"


def _outcome_of(status: int) -> str:
    """A passed-through answer: a 2xx or a 4xx (an engine 5xx is a fault answer, never passed through)."""
    return "ok" if status < 400 else "upstream_4xx"


class _RelayResponse(StreamingResponse):
    """A streamed answer; its generator (and so its leases and connections) is closed however the response ends
    (finished, failed upstream, or the client went away)."""

    def __init__(self, *, events: AsyncGenerator[bytes, None], status_code: int, headers: Mapping[str, str]) -> None:
        self._events = events
        super().__init__(events, status_code=status_code, headers=dict(headers))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with contextlib.suppress(RuntimeError):  # still running: it was cancelled and closes itself
                await self._events.aclose()
