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
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import httpx
import structlog
from starlette.responses import Response
from structlog.typing import FilteringBoundLogger

from heteroflow.serving.coordinator.attempt import (
    AttemptFailedError,
    Segment,
    UpstreamTimeouts,
    Watch,
    WithdrawnBeforeSendError,
    describe_error,
    failure_reason,
)
from heteroflow.serving.coordinator.body import InferenceRequest
from heteroflow.serving.coordinator.client_outcomes import ClientOutcomes, Disturbance
from heteroflow.serving.coordinator.errors import (
    CoordinatorError,
    NoEndpointError,
    UpstreamUnavailableError,
)
from heteroflow.serving.coordinator.metrics import CoordinatorMetrics
from heteroflow.serving.coordinator.relay_http import (
    EventReader,
    RelayResponse,
    error_text,
    parsed_body,
    returned_headers,
    stream_error_event,
    upstream_headers,
)
from heteroflow.serving.coordinator.streams import DONE, Event, StreamContext, is_abort_answer
from heteroflow.serving.coordinator.views import EndpointKey, Lease, PublicationSignal, ServingViews

_log = structlog.get_logger(__name__)


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
        outcomes: ClientOutcomes | None = None,
    ) -> None:
        self.outcomes = outcomes if outcomes is not None else ClientOutcomes()
        """What clients saw during faults (:mod:`.client_outcomes`)."""
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
        self._watches: dict[tuple[str, int], set[Watch]] = {}
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
        trouble = Disturbance(model=request.model, arrived_at=time.time())
        try:
            found = await self._send(
                request.model, path, request.raw, sent_headers, stream=request.stream,
                hold_until=min(now + self._hold, deadline), deadline=deadline, log=log, route=route, trouble=trouble,
            )  # fmt: skip
        except CoordinatorError:
            trouble.failed = True
            self._settle_trouble(trouble, waited=loop.time() - now)
            raise
        trouble.wait_sec = loop.time() - now
        if isinstance(found, Response):
            self._settle_trouble(trouble, waited=trouble.wait_sec)
            return found
        context = StreamContext(route=route, body=parsed_body(request.raw))
        return RelayResponse(
            events=self._relay(found, context, path=path, headers=sent_headers, model=request.model, route=route,
                               deadline=deadline, log=log, trouble=trouble),
            status_code=200,
            headers=returned_headers(found.response.headers, decoded=True, answered_by=found.lease.key),
        )  # fmt: skip

    def _settle_trouble(self, trouble: Disturbance, *, waited: float) -> None:
        trouble.wait_sec = max(trouble.wait_sec, waited)
        trouble.ended_at = time.time()
        self.outcomes.record(trouble)

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
        trouble: Disturbance | None = None,
    ) -> Response | Segment:
        """Send until an engine answers without a fault, re-routing and holding until ``hold_until``
        (``cut_on``: the endpoint whose stream was just cut, avoided like a failed attempt)."""
        loop = asyncio.get_running_loop()
        avoid: dict[EndpointKey, tuple[float, int]] = {}
        failures: list[tuple[EndpointKey, AttemptFailedError]] = []
        if cut_on is not None:
            avoid[cut_on] = (loop.time() + self._pause, self._views.epoch(cut_on))
        while True:
            lease = await self._acquire(model, avoid=avoid, failures=failures, until=hold_until, trouble=trouble)
            if lease is None:
                raise self._gave_up(model, failures)
            attempt_log = log.bind(instance=lease.key.instance_id, endpoint=lease.key.endpoint_id)
            try:
                return await self._attempt(
                    lease, path=path, raw=raw, headers=headers, stream=stream, deadline=deadline, log=attempt_log,
                    route=route,
                )  # fmt: skip
            except WithdrawnBeforeSendError:
                if trouble is not None:
                    trouble.rerouted = True
                    trouble.instances.add(lease.key.instance_id)
                attempt_log.info("coordinator.withdrawn_before_send", address=_address(lease.key))
            except AttemptFailedError as exc:
                now = loop.time()
                failures.append((lease.key, exc))
                if trouble is not None:
                    trouble.instances.add(lease.key.instance_id)
                    trouble.rerouted = trouble.rerouted or now < hold_until
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
        failures: Sequence[tuple[EndpointKey, AttemptFailedError]],
        until: float,
        trouble: Disturbance | None = None,
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
            if trouble is not None:
                trouble.held = True  # nothing it could use is published: it waits
            wakes = [t for key, (t, _) in avoid.items() if t > now]
            suspect = self._views.next_suspect_expiry(model, now)
            if suspect is not None:
                wakes.append(suspect)
            await self._publications.wait(published, within=min([remaining, *(t - now for t in wakes)]))

    def _gave_up(
        self, model: str, failures: Sequence[tuple[EndpointKey, AttemptFailedError]]
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
    ) -> Response | Segment:
        loop = asyncio.get_running_loop()
        response: httpx.Response | None = None
        handed_over = False
        watch: Watch | None = None
        try:
            if not self._views.is_published(lease.key):
                raise WithdrawnBeforeSendError
            upstream = self._client.build_request(
                "POST", lease.key.base_url + path, content=raw, headers=headers,
                extensions={"trace": self._tracer(lease)},
            )  # fmt: skip
            try:
                async with asyncio.timeout_at(deadline) as scope:
                    watch = self._watch(lease.key, scope)
                    started = loop.time()
                    response = await self._sent_upstream(upstream)
                    self._metrics.upstream_latency.labels(
                        instance=lease.key.instance_id, endpoint=str(lease.key.endpoint_id)
                    ).observe(loop.time() - started)
                    if response.status_code == 503:
                        detail = await self._error_detail(response)
                        raise AttemptFailedError("upstream_503", f"answered 503 (engine unavailable: {detail})")
                    if response.status_code >= 500:
                        detail = await self._error_detail(response)
                        raise AttemptFailedError(
                            "upstream_5xx", f"answered {response.status_code} (engine error: {detail})"
                        )
                    if stream and response.status_code == 200:
                        segment = await self._open(lease, response)
                        handed_over = True
                        return segment
                    body = await response.aread()
            except httpx.HTTPError as exc:
                raise AttemptFailedError(
                    failure_reason(exc),
                    f"failed ({describe_error(exc)})",
                    suspect=not isinstance(exc, httpx.TimeoutException),
                ) from exc
            except TimeoutError as exc:
                raise self._timed_out(watch) from exc
            finally:
                self._unwatch(lease.key, watch)
            if response.status_code == 200 and is_abort_answer(body):
                raise AttemptFailedError("abort", "answered 200 with finish_reason 'abort' (an incomplete answer)")
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

    async def _sent_upstream(self, upstream: httpx.Request) -> httpx.Response:
        """``client.send``, with what the transport stack raises besides its own errors made a transport failure.

        A connection the engine closes while it is being opened can reach anyio with its socket already gone:
        asking it for its TLS attributes then raises ``AttributeError`` (``'NoneType' object has no attribute
        'getpeername'``), which httpx does not translate. For the request that is the same fault as a reset,
        and is re-routed like one (reason ``disconnect``); left to propagate it would be the client's 500.
        """
        try:
            return await self._client.send(upstream, stream=True)
        except (httpx.HTTPError, WithdrawnBeforeSendError):
            raise
        except Exception as exc:  # any other failure of the send is this attempt's, never the client's
            raise AttemptFailedError("disconnect", f"failed ({describe_error(exc)})") from exc

    async def _open(self, lease: Lease, response: httpx.Response) -> Segment:
        """Read a stream up to its first event with output; a fault before that is the attempt's failure."""
        events = EventReader(response.aiter_bytes())
        buffered: list[Event] = []
        while True:
            event = await events.next()
            if event is None:
                if any(e.finish_reasons for e in buffered):
                    return Segment(lease, response, events, [*buffered, Event(DONE, done=True)], ended=True)
                raise AttemptFailedError("disconnect", "closed the stream before sending any output")
            if event.error:
                raise AttemptFailedError("error_event", f"sent an error event before any output ({error_text(event)})")
            if event.aborted and not event.text:
                raise AttemptFailedError("abort", "ended the stream with finish_reason 'abort' before any output")
            buffered.append(event)
            if event.done:
                return Segment(lease, response, events, buffered, ended=True)
            if event.text or event.tool_calls or event.finish_reasons:
                return Segment(lease, response, events, buffered)

    def _watch(self, key: EndpointKey, scope: asyncio.Timeout) -> Watch:
        watch = Watch(scope)
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

    def _unwatch(self, key: EndpointKey, watch: Watch | None) -> None:
        found = self._watches.get((key.instance_id, key.endpoint_id))
        if found is not None and watch is not None:
            found.discard(watch)
            if not found:
                del self._watches[(key.instance_id, key.endpoint_id)]

    def _timed_out(self, watch: Watch | None) -> AttemptFailedError:
        if watch is not None and watch.stalled:
            return AttemptFailedError(
                "faulted_stall", f"was reported faulted and sent nothing within {self._faulted_bound:g} s"
            )
        return AttemptFailedError(
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
                    raise WithdrawnBeforeSendError
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
        segment: Segment,
        context: StreamContext,
        *,
        path: str,
        headers: Mapping[str, str],
        model: str,
        route: str,
        deadline: float,
        log: FilteringBoundLogger,
        trouble: Disturbance | None = None,
    ) -> AsyncGenerator[bytes, None]:
        """The client's stream: the engine's events, and after a cut, the continuation's, spliced."""
        loop = asyncio.get_running_loop()
        trouble = trouble if trouble is not None else Disturbance(model=model, arrived_at=time.time())
        outcome = "client_gone"
        current: Segment | None = segment
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
                trouble.instances.add(cut_on.instance_id)
                try:
                    found = await self._send(
                        model, path, context.continuation(remaining), headers, stream=True,
                        hold_until=min(now + self._hold, deadline), deadline=deadline, log=log, route=route,
                        cut_on=cut_on, trouble=trouble,
                    )  # fmt: skip
                    trouble.wait_sec = max(trouble.wait_sec, loop.time() - now)
                except CoordinatorError as exc:
                    self._metrics.continuations.labels(outcome="failed").inc()
                    outcome = "stream_error"
                    yield stream_error_event(
                        f"the engine failed while streaming ({cut}) and the stream could not be resumed: {exc.message}",
                        code=exc.status_code,
                    )
                    return
                assert isinstance(found, Segment)
                self._metrics.continuations.labels(outcome="resumed").inc()
                context.segments += 1
                current = found
                log.info("coordinator.stream_resumed", instance=found.lease.key.instance_id,
                         endpoint=found.lease.key.endpoint_id, segment=context.segments)  # fmt: skip
        finally:
            if current is not None:
                await self._close(current)
            self._metrics.requests.labels(route=route, outcome=outcome).inc()
            trouble.resumed = trouble.resumed or outcome == "resumed"
            trouble.failed = trouble.failed or outcome == "stream_error"
            self._settle_trouble(trouble, waited=trouble.wait_sec)

    async def _events_of(
        self, segment: Segment, context: StreamContext, deadline: float
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
            watch: Watch | None = None
            try:
                async with asyncio.timeout_at(deadline) as scope:
                    watch = self._watch(segment.lease.key, scope)
                    found = await segment.events.next()
            except httpx.HTTPError as exc:
                yield None, describe_error(exc)
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
                yield None, f"an error event: {error_text(event)}"
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

    async def _close(self, segment: Segment) -> None:
        try:
            await segment.response.aclose()
        finally:
            self._release(segment.lease)


def _address(key: EndpointKey) -> str:
    return f"{key.ip}:{key.port}"


def _outcome_of(status: int) -> str:
    """A passed-through answer: a 2xx or a 4xx (an engine 5xx is a fault answer, never passed through)."""
    return "ok" if status < 400 else "upstream_4xx"
