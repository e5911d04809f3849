"""The server's periodic upkeep, shared by all nodes: one liveness statement and one token check.

Every ``liveness_flush_seconds`` the server writes every node's newest heartbeat in one statement (which
also tells which nodes still exist) and re-confirms the tokens it trusts from memory in one SELECT. This is
what lets a steady heartbeat make no database statement of its own, while a node deleted or a token
revoked through another server stops being accepted within one interval.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from heteroflow.platform_server.context import ServerContext

_log = structlog.get_logger(__name__)


async def maintain(ctx: ServerContext) -> None:
    """One round of upkeep. Failures are logged and retried on the next round."""
    result = await ctx.liveness.flush(ctx.nodes)
    now = ctx.clock.monotonic()
    ctx.node_cache.touch(result.confirmed, now=now)
    for node_id in result.missing:
        ctx.forget_node(node_id)
    await refresh_tokens(ctx)


async def refresh_tokens(ctx: ServerContext) -> None:
    hashes = ctx.token_cache.keys()
    if not hashes:
        return
    try:
        live = await asyncio.to_thread(ctx.tokens.principals, hashes)
    except Exception as exc:
        _log.warning("auth.refresh_failed", error=f"{type(exc).__name__}: {exc}"[:300])
        return
    now = ctx.clock.monotonic()
    for token_hash in hashes:
        principal = live.get(token_hash)
        if principal is None:
            ctx.token_cache.discard(token_hash)  # revoked
        else:
            ctx.token_cache.put(token_hash, principal, now=now)


async def run_maintenance(ctx: ServerContext) -> None:
    """Upkeep every ``liveness_flush_seconds`` until cancelled; the last heartbeats are flushed on exit."""
    try:
        while True:
            await asyncio.sleep(ctx.settings.liveness_flush_seconds)
            await maintain(ctx)
    finally:
        with contextlib.suppress(Exception):
            await asyncio.shield(ctx.liveness.flush(ctx.nodes))
