"""One JSON client per kind of peer: pooled connections, the bearer token, and errors that say whether to retry.

Errors (foreign ones translated here with ``raise … from``)::

    PeerError
    ├── Unavailable   nobody answered (refused, reset, timeout), or the peer answered one of the client's
    │                 ``unavailable_statuses`` (an overloaded peer's 503): the same request may succeed later,
    │                 not before ``retry_after_sec`` when the peer sent a Retry-After
    └── Rejected      the peer answered another status than the route's success, or an answer that breaks the
                      contract (``status``: the HTTP status; ``None`` when the answer was not even JSON)

The transport is a seam (httpx's ``MockTransport`` / ``ASGITransport``): ``transport_for`` maps a base URL to
one, so that tests route every peer to an in-process app; ``None`` means the network.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from heteroflow.http.tls import client_tls

_M = TypeVar("_M", bound=BaseModel)
_JSON = {"Content-Type": "application/json"}

TransportFor = Callable[[str], httpx.AsyncBaseTransport | None]
"""Base URL → a transport (tests route to in-process apps); ``None``: the network."""


def one_transport(transport: httpx.AsyncBaseTransport | None) -> TransportFor | None:
    """The :data:`TransportFor` of a client given one transport for every peer (``None``: the network)."""
    return None if transport is None else (lambda _base_url: transport)


class PeerError(Exception):
    """A peer did not do what was asked."""


class Unavailable(PeerError):
    """The peer could not be reached, or said it is overloaded: the same request may succeed later."""

    def __init__(self, message: str, *, retry_after_sec: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_sec = retry_after_sec
        """The peer's Retry-After in seconds, when it sent one: the earliest useful retry."""


class Rejected(PeerError):
    """The peer answered, and not with what the route promises: the same request will not help."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        """The HTTP status of the answer; ``None`` when there was none to speak of."""

    @property
    def status_code(self) -> int | None:
        """:attr:`status`, under httpx's name."""
        return self.status


def parse_retry_after(value: str | None) -> float | None:
    """A Retry-After header in its delay-seconds form, in seconds; ``None`` if absent or not a number of seconds.

    The HTTP-date form is not read: our services send seconds. Purely computational.
    """
    text = (value or "").strip()
    return float(text) if text.isdigit() else None


def detail_of(response: httpx.Response) -> str:
    """The sentence of an error answer: its ``detail`` (or ``error``) field, else its text; 200 characters."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:200]
    if isinstance(body, dict):
        return str(body.get("detail") or body.get("error") or body)[:200]
    return str(body)[:200]


def parse_answer(response: httpx.Response, answer: type[_M]) -> _M:
    """``response``'s body read as ``answer`` (an empty body as ``{}``); :class:`Rejected` when it is not one."""
    try:
        return answer.model_validate_json(response.content or b"{}")
    except ValidationError as exc:
        raise Rejected(
            f"{response.request.url}: unexpected answer: {exc.errors()[0]['msg']}", status=response.status_code
        ) from exc


class JsonPeer:
    """One pooled ``httpx.AsyncClient`` per base URL, every request with the bearer ``token``."""

    def __init__(
        self,
        *,
        token: str | None,
        timeout_sec: float,
        transport_for: TransportFor | None = None,
        unavailable_statuses: Collection[int] = (),
    ) -> None:
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._timeout_s = timeout_sec
        self._transport_for = transport_for
        self._unavailable = frozenset(unavailable_statuses)
        self._clients: dict[str, httpx.AsyncClient] = {}

    def _client(self, base_url: str) -> httpx.AsyncClient:
        base = base_url.rstrip("/")
        client = self._clients.get(base)
        if client is None:
            transport = self._transport_for(base) if self._transport_for is not None else None
            client = httpx.AsyncClient(
                base_url=base,
                headers=self._headers,
                timeout=self._timeout_s,
                transport=transport,
                verify=client_tls(),
            )
            self._clients[base] = client
        return client

    async def send(
        self,
        base_url: str,
        method: str,
        path: str,
        content: str | None = None,
        *,
        timeout_sec: float | None = None,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, str | int] | None = None,
    ) -> httpx.Response:
        """The peer's answer, whatever its status; :class:`Unavailable` when there is none.

        ``timeout_sec`` can only lengthen the client's timeout (a route known to take longer), never shorten it.
        ``headers`` are added to (and win over) the client's own: a request that carries another credential.
        """
        timeout = self._timeout_s if timeout_sec is None else max(timeout_sec, self._timeout_s)
        try:
            return await self._client(base_url).request(
                method, path, content=content, headers={**_JSON, **(headers or {})}, params=params, timeout=timeout
            )
        except httpx.HTTPError as exc:
            raise Unavailable(f"{method} {base_url}{path}: {type(exc).__name__}: {exc}") from exc

    def check(self, response: httpx.Response, method: str, where: str, ok: Collection[int]) -> None:
        """Nothing when ``response``'s status is in ``ok``; else :class:`Unavailable` (one of the client's
        ``unavailable_statuses``, with the peer's Retry-After) or :class:`Rejected` (any other status)."""
        status = response.status_code
        if status in ok:
            return
        message = f"{method} {where} answered HTTP {status}: {detail_of(response)}"
        if status in self._unavailable:
            raise Unavailable(message, retry_after_sec=parse_retry_after(response.headers.get("retry-after")))
        raise Rejected(message, status=status)

    async def post(
        self,
        base_url: str,
        path: str,
        body: BaseModel,
        answer: type[_M],
        *,
        ok: Collection[int] = (200,),
        timeout_sec: float | None = None,
    ) -> _M:
        """POST ``body`` (without its ``None`` fields) and read the answer as ``answer``."""
        response = await self.send(
            base_url, "POST", path, body.model_dump_json(exclude_none=True), timeout_sec=timeout_sec
        )
        self.check(response, "POST", f"{base_url}{path}", ok)
        return parse_answer(response, answer)

    async def get_object(
        self, base_url: str, path: str, *, params: Mapping[str, str | int] | None = None
    ) -> dict[str, Any]:
        """GET a JSON object (200 only), with the query ``params``."""
        response = await self.send(base_url, "GET", path, params=params)
        self.check(response, "GET", f"{base_url}{path}", (200,))
        try:
            body = response.json()
        except ValueError as exc:
            raise Rejected(f"GET {base_url}{path}: not JSON") from exc
        if not isinstance(body, dict):
            raise Rejected(f"GET {base_url}{path}: not an object")
        return body

    async def aclose(self) -> None:
        """Close every pooled client."""
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()
