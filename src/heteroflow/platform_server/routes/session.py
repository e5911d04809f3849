"""The web UI's sign-in: an API token exchanged for a browser session cookie; its description; sign-out."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from pydantic import BaseModel, Field

from heteroflow.core.authentication import bearer_of
from heteroflow.platform.auth import Principal, hash_token
from heteroflow.platform_server.auth import BEARER_SECURITY, authenticate, checked_principal, context
from heteroflow.platform_server.context import ServerContext
from heteroflow.platform_server.errors import NotFound, Unauthorized, error_responses
from heteroflow.platform_server.sessions import (
    WebSession,
    clear_cookie,
    csrf_token_of,
    new_secret,
    secure,
    session_of,
    session_secret,
    set_cookie,
)

router = APIRouter(prefix="/api/v1/auth", tags=["auth"])

Ctx = Annotated[ServerContext, Depends(context)]


class SessionOut(BaseModel):
    """A browser session: whose token it carries, until when, and the CSRF token its writes must send."""

    csrf_token: str = Field(description="Send it as X-CSRF-Token with every write made with the session cookie.")
    expires_at: datetime = Field(description="When the session ends at the latest (signing out ends it sooner).")
    token_name: str
    scopes: list[str]
    tenant_name: str | None


def _out(principal: Principal, *, csrf_token: str, expires_at: datetime) -> SessionOut:
    return SessionOut(
        csrf_token=csrf_token,
        expires_at=expires_at,
        token_name=principal.token_name,
        scopes=sorted(scope.value for scope in principal.scopes),
        tenant_name=principal.tenant_name,
    )


@router.post(
    "/session",
    status_code=201,
    response_model=SessionOut,
    summary="Sign a browser in: exchange an API token (Authorization: Bearer) for an HttpOnly session cookie",
    responses=error_responses(),
    openapi_extra=BEARER_SECURITY,
)
async def sign_in(request: Request, response: Response, ctx: Ctx) -> SessionOut:
    """The cookie carries exactly the token's scopes and tenant, for at most ``web_session_seconds`` and never
    past the token's revocation. A session the browser held before is ended."""
    token = bearer_of(request.scope)
    if token is None:
        raise Unauthorized("sign in with an API token (Authorization: Bearer <token>); a session cannot start another")
    principal = await checked_principal(request, token)
    with contextlib.suppress(Unauthorized):
        previous = session_secret(request.scope)
        if previous is not None:
            await asyncio.to_thread(ctx.sessions.delete, hash_token(previous))
    secret = new_secret()
    now = ctx.clock.now()
    # sign-ins are rare: each one sweeps the ended sessions (expired, or of a revoked token)
    await asyncio.to_thread(ctx.sessions.delete_ended, now=now)
    lifetime_sec = int(ctx.settings.web_session_seconds)
    expires_at = now + timedelta(seconds=lifetime_sec)
    await asyncio.to_thread(
        ctx.sessions.create, hash_token(secret), token_id=principal.token_id, now=now, expires_at=expires_at
    )
    response.headers.append("set-cookie", set_cookie(secret, max_age_sec=lifetime_sec, secure=secure(request.scope)))
    response.headers["cache-control"] = "no-store"
    return _out(principal, csrf_token=csrf_token_of(secret), expires_at=expires_at)


async def _session(request: Request, ctx: Ctx) -> WebSession:
    session = await session_of(ctx, request.scope)
    if session is None:
        token = bearer_of(request.scope)
        if token is None:
            raise Unauthorized("a bearer token is required (Authorization: Bearer <token>), or a browser session")
        await checked_principal(request, token)  # an unknown token learns nothing more than 401
        raise NotFound("no browser session on this request: it carries a bearer token and no session cookie")
    return session


@router.get(
    "/session",
    response_model=SessionOut,
    summary="The browser session of the cookie: its token's label, scopes and tenant, its end, its CSRF token",
    responses=error_responses(404),
    openapi_extra=BEARER_SECURITY,
)
async def describe(response: Response, session: Annotated[WebSession, Depends(_session)]) -> SessionOut:
    response.headers["cache-control"] = "no-store"
    return _out(session.principal, csrf_token=session.csrf_token, expires_at=session.expires_at)


@router.delete(
    "/session",
    status_code=204,
    summary="Sign out: end the cookie's browser session on the server and clear the cookie",
    responses=error_responses(403),
)
async def sign_out(request: Request, ctx: Ctx, _: Annotated[Principal, Depends(authenticate)]) -> Response:
    """With the session cookie (and, as every write with it, its CSRF token and this site's Origin), or with a
    bearer token: the request's session, if any, ends either way."""
    with contextlib.suppress(Unauthorized):
        secret = session_secret(request.scope)
        if secret is not None:
            await asyncio.to_thread(ctx.sessions.delete, hash_token(secret))
    response = Response(status_code=204)
    response.headers.append("set-cookie", clear_cookie(secure=secure(request.scope)))
    response.headers["cache-control"] = "no-store"
    return response
