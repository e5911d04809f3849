"""The serving dashboard's read-only proxy to the controller (``GET /api/v1/serving/…``).

The controller is another process whose routes need the cluster token. The browser must never hold that token,
so the platform server forwards three reads on the caller's behalf, adding the token itself:

    GET /api/v1/serving/status                  → GET /controller/fault_tolerance/status
    GET /api/v1/serving/rounds[?instance_id=]   → GET /controller/fault_tolerance/rounds[?instance_id=]
    GET /api/v1/serving/rounds/{request_id}     → GET /controller/fault_tolerance/rounds/{request_id}

Serving instances are cluster-wide, not tenant-scoped, so every route needs the ``serving:read`` scope (or
``admin``) on a token without a tenant (403 otherwise): a read-only operator can watch serving without holding
an admin token. What can go wrong on the way is mapped here, never to a 500:

- no controller configured (``HETEROFLOW_SERVER_CONTROLLER_URL`` unset) → 503;
- controller unreachable, timed out, refusing the cluster token, failing, or answering something that is not
  JSON → 503 with a sentence saying which (a controller 401 must not reach the browser as a 401: the page would
  read it as its own token being revoked and sign the user out);
- controller 404 (a round it does not have) → 404.

The proxy talks HTTP only: the server package is below the serving package and never imports it.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final
from urllib.parse import quote

import httpx
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse

from heteroflow.http.tls import client_tls
from heteroflow.platform.auth import Principal, Scope
from heteroflow.platform_server.auth import require_cluster_wide
from heteroflow.platform_server.context import ServerContext
from heteroflow.platform_server.errors import NotFound, ServiceUnavailable, error_responses

CONTROLLER_TIMEOUT_SEC: Final = 5.0
"""Deadline of one forwarded call (connect, read, write, pool): the page polls every 2 s and shows a stale view
with an error rather than piling up requests behind a hung controller."""

_REQUEST_ID: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$")
"""What a round id can look like (``sd-…``, ``fr-…``); anything else cannot name a round and is never put in a
URL path (no ``..``, no ``/``)."""

router = APIRouter(tags=["serving"], responses=error_responses(403))

# ``serving:read`` (or ``admin``) on a token without a tenant: serving instances belong to the whole cluster
ServingReader = Annotated[Principal, Depends(require_cluster_wide(Scope.SERVING_READ))]


class ControllerProxy:
    """GETs on the controller with the cluster token; every failure becomes one of the server's typed errors.

    ``transport`` is the seam for tests that want no socket (an ``httpx.ASGITransport``); by default the real
    network is used. One pooled client serves every call (opened on the first, closed by :meth:`aclose`, which
    the app's lifespan calls): the page polls every 2 s, and a connection per poll would cost a handshake each.
    """

    def __init__(
        self,
        base_url: str | None,
        *,
        cluster_token: str | None,
        timeout_sec: float = CONTROLLER_TIMEOUT_SEC,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._base_url = base_url.rstrip("/") if base_url else None
        self._token = cluster_token
        self._timeout = timeout_sec
        self._transport = transport
        self._client: httpx.AsyncClient | None = None

    def ensure_configured(self) -> str:
        """The controller's base URL; 503 when none is configured."""
        if self._base_url is None:
            raise ServiceUnavailable(
                "no controller configured: set HETEROFLOW_SERVER_CONTROLLER_URL (and HETEROFLOW_CLUSTER_TOKEN) "
                "on the platform server"
            )
        return self._base_url

    async def get(self, path: str, *, params: dict[str, str] | None = None) -> Any:
        """The controller's JSON answer to ``GET path``."""
        base_url = self.ensure_configured()
        headers = {"Accept": "application/json"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        if self._client is None:
            self._client = httpx.AsyncClient(
                base_url=base_url,
                timeout=self._timeout,
                transport=self._transport,
                follow_redirects=False,
                verify=client_tls(),
            )
        try:
            response = await self._client.get(path, params=params, headers=headers)
        except httpx.TimeoutException as exc:
            raise ServiceUnavailable(f"the controller at {base_url} did not answer within {self._timeout:g} s") from exc
        except httpx.HTTPError as exc:
            raise ServiceUnavailable(
                f"the controller at {base_url} is unreachable ({type(exc).__name__}: {exc})"
            ) from exc
        return self._answer(response)

    async def aclose(self) -> None:
        """Close the pooled client (a later call opens a new one)."""
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    def _answer(self, response: httpx.Response) -> Any:
        status = response.status_code
        if status == 404:
            raise NotFound(_detail(response) or "not found on the controller")
        if status in (401, 403):
            raise ServiceUnavailable(
                f"the controller refused this server's cluster token (HTTP {status}): check that "
                "HETEROFLOW_CLUSTER_TOKEN is the controller's"
            )
        if status != 200:
            detail = _detail(response)
            raise ServiceUnavailable(f"the controller answered HTTP {status}" + (f": {detail}" if detail else ""))
        try:
            return response.json()
        except ValueError as exc:
            raise ServiceUnavailable("the controller's answer is not JSON") from exc


def _detail(response: httpx.Response) -> str:
    """The controller's ``detail`` sentence, when its error body has one."""
    try:
        body = response.json()
    except ValueError:
        return ""
    detail = body.get("detail") if isinstance(body, dict) else None
    return detail[:500] if isinstance(detail, str) else ""


def controller_proxy(ctx: ServerContext) -> ControllerProxy:
    """The app's proxy to the controller configured in ``ctx`` (one per app, closed by its lifespan)."""
    return ControllerProxy(ctx.settings.controller_url, cluster_token=ctx.settings.cluster_token)


def proxy_of(request: Request) -> ControllerProxy:
    """The proxy the app holds (``app.state.controller_proxy``)."""
    proxy: ControllerProxy = request.app.state.controller_proxy
    return proxy


@router.get(
    "/api/v1/serving/status",
    summary="Fault-tolerance status of every serving instance, from the controller (serving:read, no tenant)",
)
async def serving_status(request: Request, _: ServingReader) -> JSONResponse:
    return JSONResponse(await proxy_of(request).get("/controller/fault_tolerance/status"))


@router.get(
    "/api/v1/serving/rounds",
    summary="Summaries of the rounds in the controller's memory (serving:read, no tenant)",
)
async def serving_rounds(
    request: Request, _: ServingReader, instance_id: Annotated[str | None, Query(min_length=1, max_length=200)] = None
) -> JSONResponse:
    params = {"instance_id": instance_id} if instance_id else None
    return JSONResponse(await proxy_of(request).get("/controller/fault_tolerance/rounds", params=params))


@router.get(
    "/api/v1/serving/rounds/{request_id}",
    summary="One round's evidence timeline, from the controller (serving:read, no tenant)",
    responses=error_responses(404),
)
async def serving_round(request: Request, _: ServingReader, request_id: str) -> JSONResponse:
    proxy = proxy_of(request)
    proxy.ensure_configured()  # no controller configured is a 503, whatever the id
    if _REQUEST_ID.fullmatch(request_id) is None:
        raise NotFound(f"no round {request_id!r}")
    return JSONResponse(await proxy.get(f"/controller/fault_tolerance/rounds/{quote(request_id, safe='')}"))
