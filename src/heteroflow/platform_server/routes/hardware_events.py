"""Hardware events read route (``/api/v1/hardware-events``): what the serving controller's GPU-health source
polls to learn about card faults (``engine-protocol.md``, "Hardware fault source 2").

One feed of XID events and uncorrectable-ECC / row-remap-failure increases per card, read forward from an
opaque cursor, so that a poller never misses an event between two calls and never reads one twice. Scoped like
every node route: a tenant's token sees its own nodes' cards only. The page is the wire contract
``heteroflow.contracts.hardware_events``, which the controller reads with the same models.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Depends, Query

from heteroflow.contracts.hardware_events import FEED_PATH, HardwareFeedEvent, HardwareFeedPage
from heteroflow.core.clock import utc
from heteroflow.platform.auth import NodeScope, Principal, Scope
from heteroflow.platform_server.auth import context, require
from heteroflow.platform_server.context import ServerContext
from heteroflow.platform_server.errors import BadRequest, error_responses
from heteroflow.platform_server.routes.gpu_health import SourceParam, parse_source
from heteroflow.platform_server.schemas import UtcTime
from heteroflow.storage.hardware_events import CardHardwareEvent

router = APIRouter(prefix=FEED_PATH, tags=["gpu-health"], responses=error_responses(400, 403))

Ctx = Annotated[ServerContext, Depends(context)]
Reader = Annotated[Principal, Depends(require(Scope.NODES_READ))]


def parse_cursor(cursor: str) -> tuple[int, int]:
    """``"<last XID id>.<last sample id>"``; anything else is a 400 (a client must never guess a position)."""
    parts = cursor.split(".")
    # isascii: str.isdigit() also accepts digits such as '²' that int() refuses
    if len(parts) != 2 or not all(part.isascii() and part.isdigit() and len(part) <= 18 for part in parts):
        raise BadRequest("cursor must be a next_cursor returned by this route")
    return int(parts[0]), int(parts[1])


def identity_changed(event: CardHardwareEvent, *, hold: timedelta) -> bool:
    """Whether ``event`` reached the server within ``hold`` after its node's credential was re-issued: evidence
    from a speaker that may not be the node's agent (an impostor holding a released credential), for an
    operator to confirm. Purely computational."""
    since, reported = event.speaker_since, event.reported_at
    if since is None:
        return False
    return reported is None or since <= reported < since + hold


@router.get("", response_model=HardwareFeedPage, summary="XID events and uncorrectable-error increases per card")
async def hardware_events(
    ctx: Ctx,
    principal: Reader,
    cursor: Annotated[str | None, Query(max_length=40, description="next_cursor of the previous page")] = None,
    since: Annotated[
        UtcTime | None, Query(description="Without a cursor: start here (default: now, i.e. only new events)")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="Rows of each kind read per page (default 200)")] = 200,
    source: SourceParam = "real",
) -> HardwareFeedPage:
    """Events after ``cursor``; without one, events since ``since``; without either, none but the cursor of the
    present, which a poller keeps and passes back. Events are ordered by time within a page."""
    chosen = parse_source(source)
    after = parse_cursor(cursor) if cursor is not None else None
    page = await asyncio.to_thread(
        ctx.samples.hardware_events,
        scope=NodeScope.of(principal),
        source=chosen,
        after=after,
        since=utc(since) if since is not None and after is None else None,
        limit=limit,
    )
    hold = timedelta(seconds=ctx.settings.node_reissue_hold_seconds)
    return HardwareFeedPage(
        source=chosen,
        events=[
            HardwareFeedEvent(
                node_id=e.node_id,
                node_name=e.node_name,
                gpu_index=e.gpu_index,
                uuid=e.uuid,
                kind=e.kind,
                value=e.value,
                previous=e.previous,
                at=e.at,
                tenant_id=e.tenant_id,
                card_known=e.card_known,
                identity_changed=identity_changed(e, hold=hold),
            )
            for e in page.events
        ],
        next_cursor=f"{page.xid_cursor}.{page.sample_cursor}",
        more=page.more,
    )
