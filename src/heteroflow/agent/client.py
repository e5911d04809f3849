"""The platform API as the agent sees it: register and heartbeat. The only agent module importing httpx.

Errors (one tree, foreign errors translated here with ``raise … from``); each is also the HTTP layer's
:class:`~heteroflow.http.peer.Unavailable` (retry later, ``retry_after_sec``) or
:class:`~heteroflow.http.peer.Rejected` (the same request will not help, ``status``)::

    PlatformError (a PeerError)
    ├── ServerUnavailableError   Unavailable: connection refused/reset, timeout, 5xx, 429: retry with backoff,
    │                            not before the server's Retry-After (an overloaded server answers 503 +
    │                            Retry-After)
    ├── NodeGoneError            Rejected: 404 on heartbeat: the node was deleted, register again
    ├── CredentialRequiredError  Unavailable: 409 node_credential_required on registration: the hostname is
    │                            registered and this agent holds no credential for it (its state folder was
    │                            lost); wait and retry until an operator releases the node's credential
    │                            (the server's Retry-After, when it sends one, says when to ask again)
    └── PermanentError           Rejected: 401/403/409/422: retrying the same request cannot help

The node's credential: its first registration issues one (shown once); the client sends it on every later
registration and heartbeat (``X-HeteroFlow-Node-Credential``), and keeps it in ``credential_path`` (0600) when
given one, so that a restarted agent can still speak for its node — without it, the hostname is refused 409.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

import httpx
from pydantic import ValidationError

from heteroflow.contracts.heartbeat import NodeRegistration
from heteroflow.core.ids import NodeId, Source
from heteroflow.http.peer import PeerError, Rejected, Unavailable, detail_of, parse_retry_after
from heteroflow.http.tls import client_tls


class PlatformError(PeerError):
    """Base of every error talking to the platform server."""


class ServerUnavailableError(PlatformError, Unavailable):
    """The server could not be reached, failed or is overloaded; the same request may succeed later (not before
    ``retry_after_sec`` when the server sent a Retry-After)."""


class NodeGoneError(PlatformError, Rejected):
    """The server does not know this node any more (deleted): register again."""


class CredentialRequiredError(PlatformError, Unavailable):
    """The hostname is registered and this agent cannot speak for it yet; the same registration may succeed later:
    ``retry_after_sec`` is when the server says to ask again (``None``: it did not say; an operator must release it)."""


class PermanentError(PlatformError, Rejected):
    """The server refused the request for good (bad token, hostname taken by another source or tenant)."""


@dataclass(frozen=True, slots=True)
class Registration:
    hostname: str
    vendor: str
    model: str
    gpu_count: int
    source: Source


NODE_CREDENTIAL_HEADER = "X-HeteroFlow-Node-Credential"

IDLE_CONNECTION_SEC: Final = 20.0
"""How long the agent keeps its idle connection to the server: across the 5 s between two beats (httpx's own 5 s
expired it just before each beat, and every beat opened a connection, which costs the server 1.3-1.4 times the CPU
of a beat on a kept one: docs/benchmarks.md), and under the server's keep-alive (``keep_alive_timeout_seconds``, at
least 25 s), so that a beat never goes out on a connection the server is closing at that moment. An agent that
beats less often than this opens a connection per beat."""

LOST_CONNECTION: Final = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)
"""A connection that closed or reset under the request, before an answer: a kept connection that the server or a
balancer closed as the request went out (a server of an earlier version keeps an idle connection only 5 s, the
agent's interval). A beat is sent once more, on a new connection; a registration is not (its answer carries a
credential shown once)."""


@dataclass(frozen=True, slots=True)
class Registered:
    node_id: NodeId
    created: bool
    heartbeat_interval_seconds: float
    node_credential: str | None = None
    """Issued by this registration (shown once), or ``None`` when the node's credential did not change."""


@dataclass(frozen=True, slots=True)
class BeatResult:
    xid_received: int
    xid_stored: int
    xid_rejected: tuple[str, ...]
    xid_retry: bool


class PlatformClient(Protocol):
    def register(self, registration: Registration) -> Registered: ...

    def heartbeat(self, node_id: NodeId, body: Mapping[str, Any]) -> BeatResult: ...

    def close(self) -> None: ...


def _error_code(response: httpx.Response) -> str | None:
    try:
        body = response.json()
    except ValueError:
        return None
    return str(body.get("error")) if isinstance(body, dict) else None


class HttpPlatformClient:
    """Talks to ``heteroflow server`` over HTTP with a bearer token (scope ``agent``)."""

    def __init__(
        self,
        *,
        base_url: str,
        token: str,
        timeout_sec: float = 5.0,
        transport: httpx.BaseTransport | None = None,
        credential_path: Path | None = None,
    ) -> None:
        self._credential_path = credential_path
        self._kept = _read_credential(credential_path)
        """The credential kept on disk by an earlier run (for this server and hostname)."""
        self._by_host: dict[str, str] = {}
        self._by_node: dict[NodeId, str] = {}
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout_sec,
            limits=httpx.Limits(
                max_connections=100, max_keepalive_connections=20, keepalive_expiry=IDLE_CONNECTION_SEC
            ),
            transport=transport,
            verify=client_tls(),
        )

    def _post(
        self, path: str, body: Mapping[str, Any], *, credential: str | None, resend_when_lost: bool = False
    ) -> httpx.Response:
        headers = {NODE_CREDENTIAL_HEADER: credential} if credential else None
        try:
            try:
                response = self._http.post(path, json=dict(body), headers=headers)
            except LOST_CONNECTION:
                if not resend_when_lost:
                    raise
                response = self._http.post(path, json=dict(body), headers=headers)  # the pool opens a new one
        except httpx.HTTPError as exc:
            raise ServerUnavailableError(f"{type(exc).__name__}: {exc}") from exc
        if response.status_code >= 500 or response.status_code == 429:
            # 503 and 429 are how an overloaded server says "later": retrying is right, stopping would not be
            raise ServerUnavailableError(
                f"server answered {response.status_code}: {detail_of(response)}",
                retry_after_sec=parse_retry_after(response.headers.get("retry-after")),
            )
        return response

    def register(self, registration: Registration) -> Registered:
        credential = self._by_host.get(registration.hostname) or self._kept
        try:
            wire = NodeRegistration(
                hostname=registration.hostname,
                vendor=registration.vendor,
                model=registration.model,
                gpu_count=registration.gpu_count,
                source=registration.source,
            )
        except ValidationError as exc:
            # the server's own model refuses it: its answer would be a 422, so it is not sent
            problem = exc.errors()[0]
            where = ".".join(str(part) for part in problem["loc"])
            raise PermanentError(f"registration refused (invalid {where}): {problem['msg']}") from exc
        response = self._post("/api/v1/nodes/register", wire.model_dump(mode="json"), credential=credential)
        if response.status_code == 409 and _error_code(response) == "node_credential_required":
            raise CredentialRequiredError(
                detail_of(response), retry_after_sec=parse_retry_after(response.headers.get("retry-after"))
            )
        if response.status_code != 200:
            raise PermanentError(
                f"registration refused ({response.status_code}): {detail_of(response)}", status=response.status_code
            )
        try:
            body = response.json()
            credential = body.get("node_credential")
            registered = Registered(
                node_id=NodeId(str(body["node_id"])),
                created=bool(body.get("created", False)),
                heartbeat_interval_seconds=float(body.get("heartbeat_interval_seconds", 5.0)),
                node_credential=str(credential) if credential else None,
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ServerUnavailableError(f"unreadable registration answer: {response.text[:200]}") from exc
        if registered.node_credential is not None:
            credential = registered.node_credential
            _write_credential(self._credential_path, credential)
        if credential is not None:
            self._by_host[registration.hostname] = self._by_node[registered.node_id] = credential
        return registered

    def heartbeat(self, node_id: NodeId, body: Mapping[str, Any]) -> BeatResult:
        response = self._post(
            f"/api/v1/nodes/{node_id}/heartbeat",
            body,
            credential=self._by_node.get(node_id) or self._kept,
            resend_when_lost=True,
        )
        if response.status_code == 404:
            raise NodeGoneError(f"node {node_id} is unknown to the server", status=404)
        if response.status_code != 200:
            raise PermanentError(
                f"heartbeat refused ({response.status_code}): {detail_of(response)}", status=response.status_code
            )
        try:
            xid = response.json().get("xid_events") or {}
            return BeatResult(
                xid_received=int(xid.get("received", 0)),
                xid_stored=int(xid.get("stored", 0)),
                xid_rejected=tuple(str(reason) for reason in xid.get("rejected", [])),
                xid_retry=bool(xid.get("retry", False)),
            )
        except (ValueError, AttributeError, TypeError) as exc:
            raise ServerUnavailableError(f"unreadable heartbeat answer: {response.text[:200]}") from exc

    def close(self) -> None:
        self._http.close()


def _read_credential(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text or None


def _write_credential(path: Path | None, credential: str) -> None:
    """Keep the node's credential for a restarted agent: owner-only (0700 folder, 0600 file), replaced
    atomically. A failure to write only costs the restart (the credential stays in memory)."""
    if path is None:
        return
    with contextlib.suppress(OSError):
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as sink:
            sink.write(credential + "\n")
        os.chmod(partial, 0o600)
        os.replace(partial, path)
