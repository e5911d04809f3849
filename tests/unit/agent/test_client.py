from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import httpx
import pytest

from heteroflow.agent.client import (
    CredentialRequiredError,
    HttpPlatformClient,
    NodeGoneError,
    PermanentError,
    Registration,
    ServerUnavailableError,
)
from heteroflow.core.ids import NodeId
from heteroflow.http.peer import Rejected, Unavailable

REG = Registration(hostname="n1", vendor="NVIDIA", model="H100", gpu_count=8, source="real")


def client_for(handler: httpx.MockTransport) -> HttpPlatformClient:
    return HttpPlatformClient(base_url="http://server", token="secret", transport=handler)


def test_register_and_beat_speak_the_wire_format() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path.endswith("/register"):
            return httpx.Response(200, json={"node_id": "abc", "created": True, "heartbeat_interval_seconds": 5})
        return httpx.Response(
            200,
            json={
                "status": "ok",
                "server_time": "x",
                "xid_events": {"received": 1, "stored": 1, "rejected": [], "retry": False},
            },
        )

    client = client_for(httpx.MockTransport(handler))
    registered = client.register(REG)
    assert registered.node_id == "abc"
    result = client.heartbeat(registered.node_id, {"gpu_stats": [], "xid_events": []})
    assert result.xid_stored == 1
    assert not result.xid_retry
    assert seen[0].headers["Authorization"] == "Bearer secret"
    assert json.loads(seen[0].content) == {
        "hostname": "n1",
        "vendor": "NVIDIA",
        "model": "H100",
        "gpu_count": 8,
        "source": "real",
    }
    assert seen[1].url.path == "/api/v1/nodes/abc/heartbeat"


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (404, NodeGoneError),
        (500, ServerUnavailableError),
        (503, ServerUnavailableError),
        (429, ServerUnavailableError),
        (401, PermanentError),
        (422, PermanentError),
    ],
)
def test_heartbeat_errors_carry_their_retry_meaning(status: int, error: type[Exception]) -> None:
    client = client_for(httpx.MockTransport(lambda _: httpx.Response(status, json={"detail": "x"})))
    with pytest.raises(error):
        client.heartbeat(NodeId("abc"), {})


@pytest.mark.parametrize("status", [503, 429])
@pytest.mark.parametrize("method", ["register", "heartbeat"])
def test_an_overloaded_server_means_retry_later_not_stop(status: int, method: str) -> None:
    answer = httpx.Response(status, headers={"Retry-After": "7"}, json={"error": "overloaded"})
    client = client_for(httpx.MockTransport(lambda _: answer))
    with pytest.raises(ServerUnavailableError) as raised:
        client.register(REG) if method == "register" else client.heartbeat(NodeId("abc"), {})
    assert raised.value.retry_after_sec == 7.0


@pytest.mark.parametrize(
    ("status", "kind", "code"),
    [
        (404, Rejected, 404),
        (401, Rejected, 401),
        (422, Rejected, 422),
        (503, Unavailable, None),
        (429, Unavailable, None),
    ],
)
def test_the_agents_errors_are_the_http_layers_retry_meaning(
    status: int, kind: type[Exception], code: int | None
) -> None:
    client = client_for(httpx.MockTransport(lambda _: httpx.Response(status, json={"detail": "x"})))
    with pytest.raises(kind) as raised:
        client.heartbeat(NodeId("abc"), {})
    assert getattr(raised.value, "status", None) == code


def test_a_conflict_on_register_is_permanent() -> None:
    client = client_for(httpx.MockTransport(lambda _: httpx.Response(409, json={"detail": "other source"})))
    with pytest.raises(PermanentError, match="other source"):
        client.register(REG)


def test_a_missing_node_credential_is_a_wait_with_the_servers_retry_after_not_a_refusal() -> None:
    answer = httpx.Response(
        409,
        json={"error": "node_credential_required", "detail": "this token may reclaim the node in 42 s"},
        headers={"Retry-After": "42"},
    )
    client = client_for(httpx.MockTransport(lambda _: answer))
    with pytest.raises(CredentialRequiredError, match="reclaim the node in 42 s") as caught:
        client.register(REG)
    assert caught.value.retry_after_sec == 42


def test_connection_errors_are_unavailable() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    client = client_for(httpx.MockTransport(refuse))
    with pytest.raises(ServerUnavailableError):
        client.register(REG)
    client.close()


BEAT_ANSWER = {"status": "ok", "xid_events": {"received": 0, "stored": 0, "rejected": [], "retry": False}}


@pytest.mark.parametrize("lost", [httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError])
def test_a_beat_whose_connection_is_lost_before_its_answer_is_sent_once_more(lost: type[httpx.TransportError]) -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        if len(seen) == 1:
            raise lost("closed under the request", request=request)
        return httpx.Response(200, json=BEAT_ANSWER)

    client = client_for(httpx.MockTransport(handler))
    assert client.heartbeat(NodeId("abc"), {"gpu_stats": []}).xid_stored == 0
    assert seen == ["/api/v1/nodes/abc/heartbeat"] * 2


def test_a_beat_lost_twice_and_a_lost_registration_are_unavailable_at_once() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        raise httpx.ReadError("reset", request=request)

    client = client_for(httpx.MockTransport(handler))
    with pytest.raises(ServerUnavailableError, match="ReadError"):
        client.heartbeat(NodeId("abc"), {"gpu_stats": []})
    assert len(seen) == 2  # once more, not again and again: the agent's own backoff takes it from there
    with pytest.raises(ServerUnavailableError, match="ReadError"):
        client.register(REG)  # its answer would carry a credential shown once: never sent twice
    assert seen[2:] == ["/api/v1/nodes/register"]


def test_the_node_credential_is_sent_on_every_later_call_and_kept_owner_only(tmp_path: Path) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path.endswith("/register"):
            body = {"node_id": "abc", "created": True, "heartbeat_interval_seconds": 5}
            if len(seen) == 1:
                body["node_credential"] = "hf_node-credential"
            return httpx.Response(200, json=body)
        return httpx.Response(200, json={"status": "ok", "xid_events": {}})

    path = tmp_path / "state" / "node.credential"
    old = os.umask(0o022)
    try:
        client = HttpPlatformClient(
            base_url="http://server", token="secret", transport=httpx.MockTransport(handler), credential_path=path
        )
        assert client.register(REG).node_credential == "hf_node-credential"
        client.heartbeat(NodeId("abc"), {})
        client.register(REG)
    finally:
        os.umask(old)
    assert "x-heteroflow-node-credential" not in seen[0].headers
    assert [r.headers["X-HeteroFlow-Node-Credential"] for r in seen[1:]] == ["hf_node-credential"] * 2
    assert path.read_text().strip() == "hf_node-credential"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    # a restarted agent reads it back and speaks for its node at once
    restarted = HttpPlatformClient(
        base_url="http://server", token="secret", transport=httpx.MockTransport(handler), credential_path=path
    )
    restarted.register(REG)
    assert seen[-1].headers["X-HeteroFlow-Node-Credential"] == "hf_node-credential"
