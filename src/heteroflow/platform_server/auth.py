"""Authentication dependencies: bearer tokens, scopes, and the tenant's view of nodes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import structlog
from fastapi import Depends, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from heteroflow.core.auth_failures import address_key, credential_key
from heteroflow.core.authentication import Denial, bearer_of, header
from heteroflow.core.authentication import Scope as AsgiScope
from heteroflow.core.client_limits import peer_address
from heteroflow.core.errors import StoreUnavailableError
from heteroflow.core.ids import NodeId
from heteroflow.platform.auth import Principal, Scope, hash_token
from heteroflow.platform.nodes import NODE_CREDENTIAL_HEADER, NodeRecord, speaks_for
from heteroflow.platform_server.context import ServerContext
from heteroflow.platform_server.errors import Forbidden, NotFound, ServiceUnavailable, Unauthorized, error_response
from heteroflow.platform_server.sessions import BEARER_ONLY, cookie_value, session_of

_log = structlog.get_logger(__name__)
_bearer = HTTPBearer(auto_error=False, description="An API token: Authorization: Bearer hf_…")
_CHECKED = "heteroflow.checked_principal"
"""Request state key: (token, principal) as verified before any work (:func:`check_before_work`)."""
_CHECKED_SPEAKER = "heteroflow.checked_speaker"
"""Request state key: (principal, node id, credential, node) of a heartbeat whose speaker was verified before any
work; the route takes the node from here (:func:`heartbeat_speaker`) instead of checking the credential again."""


def server_context(request: Request) -> ServerContext:
    ctx: ServerContext = request.app.state.context
    return ctx


async def context(request: Request) -> ServerContext:
    """The server context, as a dependency (async, so that FastAPI does not hop to a thread for it)."""
    return server_context(request)


async def authenticate(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> Principal:
    """The caller, from the bearer token (verified tokens are trusted from memory for a short while), else from
    the web UI's session cookie (:mod:`heteroflow.platform_server.sessions`)."""
    if credentials is None:
        session = await session_of(server_context(request), request.scope)
        if session is not None:
            return session.principal
    if credentials is None or credentials.scheme.lower() != "bearer" or not credentials.credentials:
        raise Unauthorized("a bearer token is required (Authorization: Bearer <token>)")
    return await checked_principal(request, credentials.credentials)


async def checked_principal(request: Request, token: str) -> Principal:
    """The principal of ``token``: the one :func:`check_before_work` verified for this very request, else looked up."""
    checked = request.scope.get("state", {}).get(_CHECKED)
    if checked is not None and checked[0] == token:
        principal: Principal = checked[1]
        return principal
    return await principal_of(server_context(request), token)


async def principal_of(ctx: ServerContext, token: str) -> Principal:
    """The principal of ``token``: from the cache, else one lookup (a known-unknown token costs none for a
    while, and at most a few lookups run at once, so random tokens cannot queue up the thread pool)."""
    token_hash = hash_token(token)
    now = ctx.clock.monotonic()
    principal = ctx.token_cache.get(token_hash, now=now)
    if principal is not None:
        return principal
    if ctx.unknown_tokens.get(token_hash, now=now) is not None:
        raise Unauthorized("unknown or revoked token")
    async with ctx.token_lookups:
        try:
            principal = await asyncio.to_thread(ctx.tokens.principal, token_hash)
        except StoreUnavailableError:
            # the database is down: a token verified earlier stays good; an unknown one cannot be checked
            stale = ctx.token_cache.get_stale(token_hash)
            if stale is None:
                raise
            return stale
    if principal is None:
        ctx.token_cache.discard(token_hash)
        ctx.unknown_tokens.put(token_hash, True, now=now)
        raise Unauthorized("unknown or revoked token")
    ctx.token_cache.put(token_hash, principal, now=now)
    return principal


_NODES_PREFIX = "/api/v1/nodes/"
_HEARTBEAT_SUFFIX = "/heartbeat"
_CREDENTIAL_HEADER = NODE_CREDENTIAL_HEADER.lower().encode()


_HEARTBEAT_OF = "heteroflow.heartbeat_of"
"""Scope key: ``(method, path, node id or None)`` of :func:`heartbeat_node_id`, which five layers of the middleware
stack ask for every request."""


def heartbeat_node_id(scope: AsgiScope) -> str | None:
    """The node id of a heartbeat request (``POST /api/v1/nodes/{id}/heartbeat``), or ``None``."""
    method = scope.get("method")
    path: str = scope.get("path", "")
    known = scope.get(_HEARTBEAT_OF)
    if known is not None and known[0] is method and known[1] is path:
        found: str | None = known[2]
        return found
    node_id: str | None = None
    if method == "POST" and path.startswith(_NODES_PREFIX) and path.endswith(_HEARTBEAT_SUFFIX):
        node_id = path[len(_NODES_PREFIX) : -len(_HEARTBEAT_SUFFIX)]
        if not node_id or "/" in node_id:
            node_id = None
    scope[_HEARTBEAT_OF] = (method, path, node_id)
    return node_id


async def check_before_work(ctx: ServerContext, scope: AsgiScope) -> Denial | None:
    """The credential check that runs before admission, body read and parse (:mod:`heteroflow.core.authentication`):
    a missing, unknown or revoked bearer token is refused there. A heartbeat's speaker is checked there too (the
    agent scope, and the node's own credential: :func:`speaking_node`), so that what holds a heartbeat slot is a
    verified node; other scopes and tenants are the routes' business."""
    token = bearer_of(scope)
    if token is None:
        return await _check_session(ctx, scope)
    try:
        principal = await principal_of(ctx, token)
        node_id = heartbeat_node_id(scope)
        if node_id is not None:
            if not principal.has(Scope.AGENT):
                return Denial(403, "forbidden", f"this route needs the {Scope.AGENT.value!r} scope")
            raw = header(scope, _CREDENTIAL_HEADER)
            credential = raw.decode("latin-1") if raw else None
            node = await speaking_node(ctx, principal, node_id, credential)
            scope.setdefault("state", {})[_CHECKED_SPEAKER] = (principal, node_id, credential, node)
    except (Unauthorized, NotFound) as exc:
        return Denial(exc.status_code, exc.code, exc.message)
    except StoreUnavailableError:
        return Denial(503, "unavailable", "the database is unavailable; retry later")
    # the route's dependency takes the principal from here: one hash and cache lookup per request, not two
    scope.setdefault("state", {})[_CHECKED] = (token, principal)
    return None


async def _check_session(ctx: ServerContext, scope: AsgiScope) -> Denial | None:
    """The check of a request without a bearer token: a live browser session, and for a write its Origin and
    CSRF token (403 otherwise); a heartbeat never takes a session."""
    if cookie_value(scope) is None:
        return Denial(401, "unauthorized", "a bearer token is required (Authorization: Bearer <token>)")
    if heartbeat_node_id(scope) is not None:  # refused before any lookup: the hot path spends nothing on it
        return Denial(401, "unauthorized", BEARER_ONLY)
    try:
        await session_of(ctx, scope)
    except (Unauthorized, Forbidden) as exc:
        return Denial(exc.status_code, exc.code, exc.message)
    except StoreUnavailableError:
        return Denial(503, "unavailable", "the database is unavailable; retry later")
    return None


_BEARER_ONLY_SCOPES = frozenset({Scope.AGENT, Scope.METRICS_READ, Scope.INFERENCE})
"""Scopes of routes that machines call (agents, Prometheus, the Coordinator): a browser session never reaches them."""


def _refuse_session(request: Request, scope: Scope) -> None:
    """401 on a route of a machine scope when the caller authenticated with a browser session, not a token."""
    if scope in _BEARER_ONLY_SCOPES and bearer_of(request.scope) is None:
        raise Unauthorized(BEARER_ONLY)


async def speaking_node(ctx: ServerContext, principal: Principal, node_id: str, credential: str | None) -> NodeRecord:
    """The node a heartbeat speaks for, when the caller may: the node is visible to it and the request carries
    the node's own credential (an administrator's token may speak for any node). Otherwise the same 404 as a
    missing node: one agent cannot beat, or report XID events, for another."""
    node = await visible_node(ctx, principal, node_id, cached=True)
    if Scope.ADMIN not in principal.scopes and not speaks_for(node, hash_token(credential) if credential else None):
        ctx.metrics.heartbeats_foreign.inc()
        raise NotFound(f"node {node_id!r} not found")
    return node


async def heartbeat_speaker(
    ctx: ServerContext, request: Request, principal: Principal, node_id: str, credential: str | None
) -> NodeRecord:
    """The node a heartbeat speaks for: the one :func:`check_before_work` verified for this very request (same
    principal, node id and credential), else checked here (:func:`speaking_node`)."""
    checked = request.scope.get("state", {}).get(_CHECKED_SPEAKER)
    if checked is not None and checked[0] is principal and checked[1] == node_id and checked[2] == credential:
        node: NodeRecord = checked[3]
        return node
    return await speaking_node(ctx, principal, node_id, credential)


def credential_keys(scope: AsgiScope) -> tuple[str, ...]:
    """The client keys a request's 401 counts under (:mod:`heteroflow.core.auth_failures`): its peer address, and
    its bearer token's id (a prefix of the token's hash). None for a request that presents no credential (no
    bearer token, no session cookie): it guesses nothing, and its 401 costs no lookup and no log line, so it is
    neither counted nor blocked (the public pages and probes stay reachable from a guessing address)."""
    token = bearer_of(scope)
    if token is None and cookie_value(scope) is None:
        return ()
    keys: list[str] = []
    address = address_key(peer_address(scope))
    if address is not None:
        keys.append(address)
    if token is not None:
        keys.append(credential_key(hash_token(token)))
    return tuple(keys)


def holds_valid_token(ctx: ServerContext, scope: AsgiScope) -> bool:
    """Whether the request's bearer token is one this server holds as valid in memory (never blocked for its
    address: the per-address count is a courtesy to the others behind it, not a boundary)."""
    token = bearer_of(scope)
    return token is not None and ctx.token_cache.get(hash_token(token), now=ctx.clock.monotonic()) is not None


def note_unauthorized(ctx: ServerContext, scope: AsgiScope) -> None:
    """Count a 401 under the request's client keys; log it only when it is the key's first of its window or the
    one that blocks it (the rest are counted: a guessing client never writes a line per request)."""
    keys = credential_keys(scope)
    if not keys:
        return
    line = ctx.failed_credentials.fail(keys, now=ctx.clock.monotonic())
    if line == "first":
        _log.info("auth.refused", keys=list(keys), path=str(scope.get("path", ""))[:200])
    elif line == "blocked":
        settings = ctx.settings
        _log.warning(
            "auth.blocked",
            keys=list(keys),
            failures=settings.max_failed_credentials,
            window_sec=settings.failed_credentials_window_seconds,
        )


def heartbeat_owner(scope: AsgiScope) -> tuple[str, str] | None:
    """Whose share of the heartbeat gate a heartbeat takes: ``(tenant, token)`` of the node
    :func:`check_before_work` verified for it — the node's tenant and the token that registered it (``""`` for
    none), so that neither is a value the caller chooses — or ``None`` for a request it did not verify."""
    checked = scope.get("state", {}).get(_CHECKED_SPEAKER)
    if checked is None:
        return None
    node: NodeRecord = checked[3]
    return (node.tenant_id or "", node.registered_by or "")


def verified_speaker(scope: AsgiScope) -> NodeRecord | None:
    """The node :func:`check_before_work` verified for this very heartbeat (its path's node id, its credential
    header, within the credential's length limit), or ``None``: the lean heartbeat path then leaves the request
    to the route and its dependency, which answer the refusal."""
    checked = scope.get("state", {}).get(_CHECKED_SPEAKER)
    if checked is None:
        return None
    raw = header(scope, _CREDENTIAL_HEADER)
    credential = raw.decode("latin-1") if raw else None
    if credential is not None and len(credential) > MAX_NODE_CREDENTIAL_LENGTH:
        return None
    if checked[1] != heartbeat_node_id(scope) or checked[2] != credential:
        return None
    node: NodeRecord = checked[3]
    return node


async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI's 422 for a request the route cannot read, but the 401 first to a caller without a valid token.

    FastAPI decodes a JSON body before it resolves the route's dependencies, so a body that is not JSON would be
    described to a caller who never showed a token. Every other validation error comes after the dependencies,
    the token check included, and passes through unchanged.
    """
    if any(error.get("type") == "json_invalid" for error in exc.errors()):
        try:
            await authenticate(request, await _bearer(request))
        except Unauthorized as refused:
            return error_response(refused)
        except StoreUnavailableError:
            return error_response(ServiceUnavailable("the database is unavailable; retry later"))
    errors = [_serialisable(error) for error in exc.errors()]
    return await request_validation_exception_handler(request, RequestValidationError(errors, body=None))


def _serialisable(error: Any) -> Any:
    """A validation error as it can be written back: its ``input`` (and ``ctx``) dropped when they are not JSON
    (NaN, a lone surrogate, bytes) — the 422 must never fail on the very input it describes."""
    if not isinstance(error, dict):
        return error
    kept = dict(error)
    for key in ("input", "ctx"):
        if key in kept:
            try:
                json.dumps(jsonable_encoder(kept[key]), allow_nan=False).encode("utf-8")
            except (TypeError, ValueError, UnicodeEncodeError):
                kept[key] = repr(kept[key]).encode("ascii", "backslashreplace").decode("ascii")[:200]
    if isinstance(kept.get("msg"), str):
        kept["msg"] = kept["msg"].encode("utf-8", "backslashreplace").decode("utf-8")
    return kept


def require(scope: Scope) -> Callable[..., Awaitable[Principal]]:
    """A dependency that authenticates and demands ``scope`` (``admin`` grants every scope)."""

    async def dependency(request: Request, principal: Annotated[Principal, Depends(authenticate)]) -> Principal:
        _refuse_session(request, scope)
        return demand(principal, scope)

    dependency.__name__ = f"require_{scope.value.replace(':', '_')}"
    return dependency


def demand(principal: Principal, scope: Scope) -> Principal:
    """``principal`` if it holds ``scope`` (``admin`` grants every scope), else 403."""
    if not principal.has(scope):
        raise Forbidden(f"this route needs the {scope.value!r} scope")
    return principal


BEARER_SECURITY: dict[str, Any] = {"security": [{"HTTPBearer": []}]}
"""The token's part of ``openapi_extra`` for a route that authenticates in its own dependency."""

MAX_NODE_CREDENTIAL_LENGTH = 200
NODE_CREDENTIAL_DESCRIPTION = "The node's own credential, as the node's first registration issued it."
SPEAKER_OPENAPI: dict[str, Any] = {
    **BEARER_SECURITY,
    "parameters": [
        {
            "description": NODE_CREDENTIAL_DESCRIPTION,
            "in": "header",
            "name": NODE_CREDENTIAL_HEADER,
            "required": False,
            "schema": {
                "anyOf": [{"maxLength": MAX_NODE_CREDENTIAL_LENGTH, "type": "string"}, {"type": "null"}],
                "description": NODE_CREDENTIAL_DESCRIPTION,
                "title": NODE_CREDENTIAL_HEADER.title(),
            },
        }
    ],
}
"""``openapi_extra`` of a route that takes its node through :func:`require_speaker`: the token, and the node's
credential header as FastAPI would describe a declared header parameter."""


def require_speaker() -> Callable[..., Awaitable[NodeRecord]]:
    """The node a heartbeat speaks for (:func:`heartbeat_speaker`), as one dependency: the bearer token with the
    agent scope (401/403 before the body is validated), the node id of the path and the node's credential header
    (at most 200 characters, else 422), the node handed over from :func:`check_before_work` when it verified
    this very request. A route using it declares ``SPEAKER_OPENAPI``."""

    async def dependency(request: Request) -> NodeRecord:
        scope = request.scope
        token = bearer_of(scope)
        if token is None:
            raise Unauthorized("a bearer token is required (Authorization: Bearer <token>)")
        principal = demand(await checked_principal(request, token), Scope.AGENT)
        raw = header(scope, _CREDENTIAL_HEADER)
        credential = raw.decode("latin-1") if raw else None
        if credential is not None and len(credential) > MAX_NODE_CREDENTIAL_LENGTH:
            raise RequestValidationError(
                [
                    {
                        "type": "string_too_long",
                        "loc": ("header", NODE_CREDENTIAL_HEADER),
                        "msg": f"String should have at most {MAX_NODE_CREDENTIAL_LENGTH} characters",
                        "input": credential,
                        "ctx": {"max_length": MAX_NODE_CREDENTIAL_LENGTH},
                    }
                ]
            )
        node_id: str = request.path_params["node_id"]
        return await heartbeat_speaker(server_context(request), request, principal, node_id, credential)

    dependency.__name__ = "require_speaker"
    return dependency


def require_cluster_wide(scope: Scope) -> Callable[..., Awaitable[Principal]]:
    """Like :func:`require`, and on a token without a tenant: the route's data covers every tenant's nodes (the
    Prometheus series name them; the status counts them), so a tenant's token gets 403 whatever its scopes."""

    async def dependency(request: Request, principal: Annotated[Principal, Depends(authenticate)]) -> Principal:
        _refuse_session(request, scope)
        if not principal.has(scope):
            raise Forbidden(f"this route needs the {scope.value!r} scope")
        if principal.tenant_id is not None:
            raise Forbidden(f"this route covers every tenant: it needs {scope.value!r} on a token without a tenant")
        return principal

    dependency.__name__ = f"require_cluster_wide_{scope.value.replace(':', '_')}"
    return dependency


async def visible_node(ctx: ServerContext, principal: Principal, node_id: str, *, cached: bool) -> NodeRecord:
    """The node if it exists and the caller may see it; otherwise the same 404 either way (H-80)."""
    node: NodeRecord | None = None
    now = ctx.clock.monotonic()
    if cached:
        node = ctx.node_cache.get(NodeId(node_id), now=now)
        # a missing id answered from memory too: "missing" costs what "not yours" costs (no timing oracle, and
        # no statement per beat for an id that names nothing)
        if node is None and ctx.missing_nodes.get(node_id, now=now):
            raise NotFound(f"node {node_id!r} not found")
    if node is None:
        try:
            node = await asyncio.to_thread(ctx.nodes.get, NodeId(node_id))
        except StoreUnavailableError:
            node = ctx.node_cache.get_stale(NodeId(node_id)) if cached else None
            if node is None:
                raise
        else:
            if node is None:
                ctx.node_cache.discard(NodeId(node_id))
                ctx.missing_nodes.put(node_id, True, now=now)
            else:
                ctx.node_cache.put(node.id, node, now=now)
    if node is None or not principal.sees_node(node.tenant_id):
        raise NotFound(f"node {node_id!r} not found")
    return node
