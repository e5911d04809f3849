"""Node routes: registration and heartbeats (agents), listing and deletion (operators)."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict
from datetime import datetime, timedelta
from typing import Annotated, Literal, Protocol

import msgspec
import structlog
from fastapi import APIRouter, Depends, Header, Query, Request, Response
from pydantic import TypeAdapter
from starlette.types import ASGIApp, Message, Receive, Send
from starlette.types import Scope as AsgiScope

from heteroflow.contracts.heartbeat import (
    Heartbeat,
    HeartbeatAccepted,
    NodeRegistered,
    NodeRegistration,
    XidEventsResult,
)
from heteroflow.core.authentication import header
from heteroflow.core.ids import NodeId
from heteroflow.core.request_body import CLEAN_TEXT
from heteroflow.core.text import text_problem
from heteroflow.health.beat_stats import WIRE_BEAT, WireBeat, beat_readings
from heteroflow.health.heartbeat import XID_TOO_OLD, ParsedXid, xid_events_from_wire
from heteroflow.health.sample_times import SampleTimeWindow, TimeFix
from heteroflow.health.tool_stalls import ToolStallReport, parse_tool_stalls
from heteroflow.health.xid_collection import XidCollectionReport, parse_xid_collection
from heteroflow.platform.auth import NodeScope, Principal, Scope, generate_token, hash_token
from heteroflow.platform.cards import NODE_CARDS_REFUSED, cards_refused_message
from heteroflow.platform.nodes import (
    NODE_CREDENTIAL_HEADER,
    NodeConflictError,
    NodeCredentialError,
    NodeQuotaError,
    NodeRecord,
    Quota,
    is_online,
    newest,
)
from heteroflow.platform_server.auth import (
    SPEAKER_OPENAPI,
    context,
    require,
    require_speaker,
    server_context,
    verified_speaker,
    visible_node,
)
from heteroflow.platform_server.context import ServerContext
from heteroflow.platform_server.errors import (
    Conflict,
    NodeCredentialRequired,
    NotFound,
    TooManyRequests,
    error_responses,
)
from heteroflow.platform_server.schemas import (
    NodeCardsOut,
    NodeCredentialOut,
    NodeList,
    NodeOut,
    ToolStallOut,
    XidCollectionOut,
    XidUnwatchedOut,
)

router = APIRouter(prefix="/api/v1/nodes", tags=["nodes"], responses=error_responses(403))
_log = structlog.get_logger(__name__)

Ctx = Annotated[ServerContext, Depends(context)]
NodeCredential = Annotated[
    str | None,
    Header(
        alias=NODE_CREDENTIAL_HEADER,
        max_length=200,
        description="The node's own credential, as the node's first registration issued it.",
    ),
]


def node_out(ctx: ServerContext, node: NodeRecord) -> NodeOut:
    last = newest(node.last_heartbeat_at, ctx.liveness.last_seen(node.id))
    offline_after = timedelta(seconds=ctx.settings.offline_after_seconds)
    return NodeOut(
        id=node.id,
        name=node.name,
        vendor=node.vendor,
        model=node.model,
        gpu_count=node.gpu_count,
        source=node.source,
        tenant_id=node.tenant_id,
        registered_at=node.registered_at,
        last_heartbeat=last,
        online=is_online(last, now=ctx.clock.now(), offline_after=offline_after),
        xid_events=xid_collection_out(ctx.xid_collection.get(NodeId(node.id), now=ctx.clock.monotonic())),
        tool_stalls=tool_stalls_out(ctx.tool_stalls.get(NodeId(node.id), now=ctx.clock.monotonic())),
        credential=credential_out(node),
        cards=NodeCardsOut(**asdict(ctx.cards.status(node.id, gpu_count=node.gpu_count, now=ctx.clock.monotonic()))),
    )


def credential_out(node: NodeRecord) -> NodeCredentialOut:
    if node.credential_hash is not None:
        state: Literal["issued", "released", "none"] = "issued"
    else:
        state = "none" if node.registered_by is None else "released"
    return NodeCredentialOut(
        state=state,
        issued_at=node.credential_issued_at,
        reissued=node.credential_issued_at is not None and node.credential_issued_at > node.registered_at,
        released_at=node.credential_released_at,
    )


def tool_stalls_out(stalls: tuple[ToolStallReport, ...] | None) -> list[ToolStallOut] | None:
    if stalls is None:
        return None
    return [ToolStallOut(tool=stall.tool, since=stall.since, timeouts=stall.timeouts) for stall in stalls]


def xid_collection_out(report: XidCollectionReport | None) -> XidCollectionOut | None:
    if report is None:
        return None
    return XidCollectionOut(
        state=report.state,
        reason=report.reason,
        watched=list(report.watched),
        unwatched=[XidUnwatchedOut(index=index, error=error) for index, error in report.unwatched],
        lost=list(report.lost),
        sources=[source for source in report.sources if source in ("nvml", "kernel_log")],
        kernel_log=report.kernel_log,
    )


@router.post(
    "/register",
    response_model=NodeRegistered,
    summary="Register a node (agents)",
    responses=error_responses(400, 409, 413, 429),
)
async def register(
    body: NodeRegistration,
    ctx: Ctx,
    principal: Annotated[Principal, Depends(require(Scope.AGENT))],
    credential: NodeCredential = None,
) -> NodeRegistered:
    """Register by hostname, unique within the caller's tenant. A new node gets its own credential, shown once;
    the same hostname again returns the same node id to a caller that presents it (agents restart). Without it,
    409 ``node_credential_required``: only an operator gives the node a new credential — an administrator's
    token, or the node's ``release``, after which the token that created it claims one at its next registration.
    A silent node is never reclaimed by time: its silence can be provoked (``docs/reliability.md``)."""
    issued = generate_token()
    now = ctx.clock.now()
    try:
        result = await asyncio.to_thread(
            ctx.nodes.register,
            name=body.hostname,
            vendor=body.vendor,
            model=body.model,
            gpu_count=body.gpu_count,
            source=body.source,
            tenant_id=principal.tenant_id,
            now=now,
            token_id=principal.token_id,
            presented_hash=hash_token(credential) if credential else None,
            new_credential_hash=hash_token(issued),
            reissue=principal.has(Scope.ADMIN) and not credential,
            quota=Quota(max_nodes=ctx.settings.max_nodes_per_token, max_cards=ctx.settings.max_cards_per_token),
        )
    except NodeQuotaError as exc:
        raise TooManyRequests(str(exc)) from exc
    except NodeCredentialError as exc:
        raise NodeCredentialRequired(str(exc)) from exc
    except NodeConflictError as exc:
        raise Conflict(str(exc)) from exc
    node = result.node
    ctx.node_cache.put(node.id, node, now=ctx.clock.monotonic())
    ctx.cards.relearn(node.id)  # its cards (and gpu_count) may have changed: learnt afresh from its beats
    ctx.missing_nodes.discard(node.id)
    _log.info(
        "node.registered",
        node_id=node.id,
        hostname=node.name,
        created=result.created,
        credential_issued=result.issued,
        source=node.source,
    )
    return NodeRegistered(
        node_id=node.id,
        created=result.created,
        heartbeat_interval_seconds=ctx.settings.heartbeat_interval_seconds,
        node_credential=issued if result.issued else None,
    )


@router.post(
    "/{node_id}/release",
    response_model=NodeOut,
    summary="Release a node's credential (operators)",
    responses=error_responses(404),
)
async def release_node(
    node_id: str, ctx: Ctx, principal: Annotated[Principal, Depends(require(Scope.NODES_WRITE))]
) -> NodeOut:
    """For an agent that lost its stored credential: the node keeps its id and history, no one speaks for it
    (its beats are 404), and the token that created it claims a new credential at its next registration.
    Another token, of this tenant or another, cannot. The release and the re-issue are recorded (the node's
    ``credential``), and the node's hardware events for a while after the re-issue are held for an operator."""
    node = await visible_node(ctx, principal, node_id, cached=False)
    released = await asyncio.to_thread(ctx.nodes.release_credential, node.id, now=ctx.clock.now())
    if released is None:
        raise NotFound(f"node {node_id!r} not found")
    ctx.node_cache.put(released.id, released, now=ctx.clock.monotonic())
    _log.info("node.credential_released", node_id=node.id, hostname=node.name)
    return node_out(ctx, released)


_speaker = require_speaker()


@router.post(
    "/{node_id}/heartbeat",
    response_model=HeartbeatAccepted,
    summary="Heartbeat (agents)",
    responses=error_responses(400, 401, 404, 413),
    openapi_extra=SPEAKER_OPENAPI,
)
async def heartbeat(
    node_id: str,
    body: Heartbeat,
    request: Request,
    node: Annotated[NodeRecord, Depends(_speaker)],
) -> Response:
    """Record liveness and offer the GPU health readings to the side path.

    In steady state this makes no database statement: the token and the node come from short-lived
    caches, liveness is flushed in batches, and unchanged health readings are skipped by the dedup cache.
    A health write that fails never fails the beat. XID events are stored before answering; when that
    fails, ``xid_events.retry`` tells the agent to keep them and send them again. A beat without the node's
    credential is the same 404 as a missing node: one agent cannot beat, or report XID events, for another.
    """
    # the speaker (token, agent scope, node credential) was verified before the body was read (platform_server/auth.py:
    # check_before_work): its node is handed over, the credential is not hashed and looked up again
    clean = request.scope.get("state", {}).get(CLEAN_TEXT, False)
    answer = await record_beat(server_context(request), node, body, clean=clean, started=time.perf_counter())
    return Response(answer, media_type="application/json")


async def record_beat(
    ctx: ServerContext, node: NodeRecord, body: Heartbeat | WireBeat, *, clean: bool, started: float
) -> bytes:
    """A verified node's validated beat: liveness, the side paths, the XID events; the answer's JSON."""
    received_at = ctx.clock.now()
    ctx.liveness.beat(node.id, received_at)
    # every agent-claimed time is checked against this server's clock, per value (sample_times.py); one card's
    # unwritable text (a lone surrogate, NUL, a bidi override) costs that card's reading, never the beat or the
    # batch the writer puts it in
    window = ctx.health_settings.sample_time_window()
    # the body was screened as it arrived (core/request_body.py): clean text, without a single escape, holds no
    # refused string; only the rest is screened here, the whole list at once and then a card at a time
    stats = body.gpu_stats
    if not clean and _bad_text(stats) is not None:
        stats = [stat for stat in stats if _bad_text(stat) is None]
    # each stat is read once for both side paths (health/beat_stats.py)
    parsed = beat_readings(stats, node_id=node.id, source=node.source, received_at=received_at, window=window)
    readings, metric_readings = parsed.health, parsed.metrics
    # a node reports only the cards it has (platform/cards.py): a card beyond them is refused, never the beat
    verdict = ctx.cards.admit(
        node.id,
        gpu_count=node.gpu_count,
        cards=[(reading.key.gpu_index, reading.uuid) for reading in readings],
        now=ctx.clock.monotonic(),
    )
    if verdict.refused:
        readings = [reading for reading in readings if reading.key.gpu_index not in verdict.refused]
        metric_readings = [reading for reading in metric_readings if reading.key.gpu_index not in verdict.refused]
        _cards_refused(ctx, node, count=len(verdict.refused), first=verdict.first_refusal)
    invalid = parsed.invalid + len(body.gpu_stats) - len(stats)
    if invalid:
        ctx.metrics.health_stats_invalid.inc(invalid)
    ctx.ingestor.offer(readings)
    if parsed.corrected:  # nearly every beat: no counting at all
        _count_time_fixes(ctx, "health", readings)
        _count_time_fixes(ctx, "telemetry", metric_readings)
    ctx.metrics_recorder.offer(node, metrics=metric_readings, health=readings)
    ctx.xid_collection.record(node.id, parse_xid_collection(body.xid_collection), now=ctx.clock.monotonic())
    ctx.tool_stalls.record(node.id, node.name, parse_tool_stalls(body.tool_stalls), now=ctx.clock.monotonic())
    xid_result = await _store_xid_events(ctx, node, body, received_at=received_at, window=window, clean=clean)
    ctx.metrics.beats.observe(time.perf_counter() - started)
    return accepted_json(received_at, xid_result)


NO_XID_EVENTS = XidEventsResult(received=0, stored=0, rejected=[], retry=False)
"""The XID part of a beat without events (nearly every beat): rendered once, at import."""
_SERVER_TIME = TypeAdapter(datetime)
_ACCEPTED_HEAD = b'{"status":"ok","server_time":'
_ACCEPTED_NO_XID_TAIL = b',"xid_events":' + NO_XID_EVENTS.model_dump_json().encode() + b"}"


def accepted_json(received_at: datetime, xid_events: XidEventsResult) -> bytes:
    """The :class:`HeartbeatAccepted` answer as its model renders it; a beat without XID events is put together
    from parts rendered by the same serialiser (the time) and at import (the rest)."""
    if xid_events is NO_XID_EVENTS:
        return _ACCEPTED_HEAD + _SERVER_TIME.dump_json(received_at) + _ACCEPTED_NO_XID_TAIL
    return HeartbeatAccepted(server_time=received_at, xid_events=xid_events).model_dump_json().encode()


def _count_time_fixes(ctx: ServerContext, kind: str, readings: Iterable[_Fixed]) -> None:
    fixes = [reading.time_fix for reading in readings if reading.time_fix is not None]
    if not fixes:  # nearly every beat: no counting at all
        return
    for fix, count in Counter(fixes).items():
        ctx.metrics.sample_times_corrected.labels(kind=kind, reason=fix.value).inc(count)


class _Fixed(Protocol):
    @property
    def time_fix(self) -> TimeFix | None: ...


def _bad_text(value: object) -> str | None:
    """The first text problem (:func:`heteroflow.core.text.text_problem`) in a wire object's strings."""
    # C-speed screen first: json.dumps escapes every refused character but DEL with a backslash, so an object
    # whose ASCII rendering has neither holds none; only the rare rest is walked (the walk was ~20 % of a beat)
    rendered = json.dumps(value)
    if "\\" not in rendered and "\x7f" not in rendered:
        return None
    return _walk_text(value)


def _walk_text(value: object) -> str | None:
    if isinstance(value, str):
        return text_problem(value)
    if isinstance(value, dict):
        value = [*value.keys(), *value.values()]
    if isinstance(value, list):
        for item in value:
            problem = _walk_text(item)
            if problem is not None:
                return problem
    return None


async def _store_xid_events(
    ctx: ServerContext,
    node: NodeRecord,
    body: Heartbeat | WireBeat,
    *,
    received_at: datetime,
    window: SampleTimeWindow,
    clean: bool,
) -> XidEventsResult:
    if not body.xid_events:
        return NO_XID_EVENTS
    # an event no database can store is rejected for good (retry false): kept, it would poison every beat
    poisoned = [] if clean else [f"event {n}: {p}" for n, e in enumerate(body.xid_events) if (p := _bad_text(e))]
    usable = body.xid_events if clean else [e for e in body.xid_events if _bad_text(e) is None]
    events, rejected = xid_events_from_wire(usable, received_at=received_at, window=window)
    rejected = [*poisoned, *rejected]
    events, refused = _bounded_xid_events(ctx, node, events)
    rejected += refused
    _count_time_fixes(ctx, "xid", events)
    too_old = sum(1 for reason in rejected if reason.endswith(XID_TOO_OLD))
    if too_old:
        ctx.metrics.sample_times_corrected.labels(kind="xid", reason=TimeFix.TOO_OLD.value).inc(too_old)
    try:
        stored = await asyncio.to_thread(
            ctx.samples.insert_xid_events,
            events,
            node_id=node.id,
            source=node.source,
            received_at=ctx.clock.now(),
        )
    except Exception as exc:  # the side path never fails the beat; the agent re-sends
        ctx.metrics.xid_event_failures.inc()
        _log.warning("xid.write_failed", node_id=node.id, error=f"{type(exc).__name__}: {exc}"[:300])
        return XidEventsResult(received=len(body.xid_events), stored=0, rejected=rejected, retry=True)
    ctx.metrics.xid_events_stored.inc(stored)
    return XidEventsResult(received=len(body.xid_events), stored=stored, rejected=rejected, retry=False)


def _bounded_xid_events(
    ctx: ServerContext, node: NodeRecord, events: list[ParsedXid]
) -> tuple[list[ParsedXid], list[str]]:
    """The XID events of a beat that may be stored (a card the node has; within the beat's and the node's hour's
    bounds), and a reason for each of the others (rejected for good: re-sending them cannot help)."""
    now = ctx.clock.monotonic()
    kept: list[ParsedXid] = []
    rejected: list[str] = []
    for event in events:
        if ctx.cards.has_card(node.id, index=event.gpu_index, gpu_count=node.gpu_count):
            kept.append(event)
        else:
            rejected.append(f"xid event on GPU {event.gpu_index}: none of the node's {node.gpu_count} GPUs")
    first = ctx.cards.refuse_xid_events(node.id, count=len(rejected), now=now)
    allowed, over = ctx.cards.take_xid_events(node.id, count=len(kept), now=now)
    if allowed < len(kept):
        limits = ctx.cards.limits
        rejected.append(
            f"{len(kept) - allowed} xid events over the bound ({limits.xid_events_per_beat} a beat, "
            f"{limits.xid_events_per_hour} a node-hour)"
        )
        kept = kept[:allowed]
    refused = len(events) - len(kept)
    if refused:
        ctx.metrics.xid_events_refused.inc(refused)
        _cards_refused(ctx, node, count=0, first=first or over)
    return kept, rejected


def _cards_refused(ctx: ServerContext, node: NodeRecord, *, count: int, first: bool) -> None:
    """Count refused cards; on the node's first refusal, raise its alert in the background (a beat never waits on
    the alert's write)."""
    if count:
        ctx.metrics.cards_refused.inc(count)
    if not first:
        return
    _log.warning("node.cards_refused", node_id=node.id, hostname=node.name, gpu_count=node.gpu_count)
    task = asyncio.create_task(_raise_cards_refused(ctx, node), name="cards-refused-alert")
    ctx.tasks.append(task)
    task.add_done_callback(lambda done: ctx.tasks.remove(done) if done in ctx.tasks else None)


async def _raise_cards_refused(ctx: ServerContext, node: NodeRecord) -> None:
    try:
        alert, created = await asyncio.to_thread(
            ctx.alerts.raise_alert,
            type=NODE_CARDS_REFUSED,
            severity="WARN",
            node_id=node.id,
            node_name=node.name,
            tenant_id=node.tenant_id,
            message=cards_refused_message(node_name=node.name, registered=node.gpu_count),
            now=ctx.clock.now(),
        )
    except Exception as exc:  # the alert is best effort; the counts stay in the node's status
        _log.warning("node.cards_refused_alert_failed", node_id=node.id, error=f"{type(exc).__name__}: {exc}"[:300])
        return
    if created:
        ctx.notifier.submit("raised", alert)


@router.get("", response_model=NodeList, summary="List the nodes in the caller's scope")
async def list_nodes(
    ctx: Ctx,
    principal: Annotated[Principal, Depends(require(Scope.NODES_READ))],
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
    offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
) -> NodeList:
    nodes, total = await asyncio.to_thread(ctx.nodes.list, scope=NodeScope.of(principal), limit=limit, offset=offset)
    return NodeList(items=[node_out(ctx, node) for node in nodes], total=total, limit=limit, offset=offset)


@router.get("/{node_id}", response_model=NodeOut, summary="One node", responses=error_responses(404))
async def get_node(
    node_id: str, ctx: Ctx, principal: Annotated[Principal, Depends(require(Scope.NODES_READ))]
) -> NodeOut:
    return node_out(ctx, await visible_node(ctx, principal, node_id, cached=False))


@router.delete(
    "/{node_id}",
    status_code=204,
    summary="Delete a node with its samples and events",
    responses=error_responses(404),
)
async def delete_node(
    node_id: str, ctx: Ctx, principal: Annotated[Principal, Depends(require(Scope.NODES_WRITE))]
) -> Response:
    node = await visible_node(ctx, principal, node_id, cached=False)
    await asyncio.to_thread(ctx.nodes.delete, node.id)
    ctx.forget_node(NodeId(node.id))
    await asyncio.to_thread(ctx.alerts.sweep_node, node.id, now=ctx.clock.now())  # close its orphaned alerts
    _log.info("node.deleted", node_id=node.id, hostname=node.name)
    return Response(status_code=204)


class LeanHeartbeat:
    """ASGI middleware, innermost of the stack (after the token check, the client limits, admission and the body
    screen): a heartbeat whose speaker was verified before its body was read, sent as ``application/json`` and
    valid against :class:`Heartbeat`, is recorded here (:func:`record_beat`) without FastAPI's routing,
    dependency resolution and body handling, which were half of a steady beat's CPU. Every other request, and
    every heartbeat this path would refuse (unverified, not JSON, invalid, a credential over its length), goes
    on to the route unchanged, its body replayed, so that its answer is the route's: the route, its OpenAPI
    description and its refusals stay the contract. Nothing is recorded before the body is known good."""

    def __init__(self, app: ASGIApp, *, ctx: ServerContext) -> None:
        self.app = app
        self.ctx = ctx

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        # verified_speaker is None for anything but a heartbeat whose path and credential check_before_work verified
        node = verified_speaker(scope) if scope["type"] == "http" else None
        if node is None or not _declares_plain_json(scope):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        message = await receive()
        # the body screen hands the body over in one message; anything else is the route's to read
        body = None
        clean = scope.get("state", {}).get(CLEAN_TEXT, False)
        if message["type"] == "http.request" and not message.get("more_body", False):
            body = decoded_heartbeat(message.get("body", b""), clean=clean)
        if body is None:
            await self.app(scope, _replaying(message, receive), send)
            return
        answer = await record_beat(self.ctx, node, body, clean=clean, started=started)
        headers = [(b"content-length", str(len(answer)).encode()), (b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})


def decoded_heartbeat(body: bytes, *, clean: bool) -> Heartbeat | WireBeat | None:
    """What the route would validate from ``body`` (``json.loads``, then the :class:`Heartbeat` model), or ``None``
    where the route would refuse it (not JSON, not a heartbeat: the route answers it).

    A clean body (plain printable ASCII without an escape, ``core/request_body.py``) as the common agent sends it
    is decoded, typed and bounded in one step in native code (:data:`~heteroflow.health.beat_stats.WIRE_BEAT`),
    about a third of pydantic's own one-step parse, which in turn takes a third of ``json.loads`` and the model's
    validation for an agent's 3.4 KB beat. A clean body with an odd value is decoded by pydantic's parser, and the
    rest the route's way. Where they accept a body they give the same readings and XID parts (tests compare them);
    where a one-step parser refuses what ``json.loads`` takes (nesting deeper than its limit), the route's way
    decides."""
    if clean:
        try:
            return WIRE_BEAT.decode(body)
        except msgspec.DecodeError:  # its ValidationError included
            pass
        try:
            return Heartbeat.model_validate_json(body)
        except ValueError:
            pass  # decided below, exactly as the route decides
    try:
        return Heartbeat.model_validate(json.loads(body))
    except ValueError:  # not JSON, or not a heartbeat (ValidationError)
        return None


def _declares_plain_json(scope: AsgiScope) -> bool:
    raw = header(scope, b"content-type")
    return raw is not None and raw.split(b";", 1)[0].strip().lower() == b"application/json"


def _replaying(first: Message, receive: Receive) -> Receive:
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return first
        return await receive()

    return replay
