from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from heteroflow.core.admission import (
    AdmissionGate,
    AdmissionLimit,
    AdmissionStatus,
    Message,
    Refusal,
    Scope,
)


def test_the_gate_admits_up_to_its_size_and_counts_refusals() -> None:
    gate = AdmissionGate(max_in_flight=2)
    assert [gate.try_enter() for _ in range(3)] == [None, None, "busy"]
    gate.leave()
    assert gate.try_enter() is None
    assert gate.status() == AdmissionStatus(
        max_in_flight=2, max_lag_sec=None, in_flight=2, peak_in_flight=2, lag_sec=0.0, peak_lag_sec=0.0,
        admitted_total=3, refused_busy_total=1, refused_lagging_total=0,
    )  # fmt: skip


def test_while_the_loop_lags_beyond_the_bound_nothing_is_admitted() -> None:
    gate = AdmissionGate(max_in_flight=10, max_lag_sec=1.0)
    gate.observe_lag(1.0)
    assert gate.try_enter() is None  # at the bound: still in time
    gate.observe_lag(1.5)
    assert gate.try_enter() == "lagging"
    gate.observe_lag(0.02)  # caught up
    assert gate.try_enter() is None
    status = gate.status()
    assert (status.in_flight, status.lag_sec, status.peak_lag_sec, status.refused_lagging_total) == (2, 0.02, 1.5, 1)


def test_lag_is_ignored_without_a_bound() -> None:
    gate = AdmissionGate(max_in_flight=1)
    gate.observe_lag(60.0)
    assert gate.try_enter() is None


@pytest.mark.parametrize(("max_in_flight", "max_lag_sec"), [(0, None), (1, 0.0), (1, -1.0)])
def test_a_gate_must_admit_something(max_in_flight: int, max_lag_sec: float | None) -> None:
    with pytest.raises(ValueError, match=r"at least one|positive"):
        AdmissionGate(max_in_flight=max_in_flight, max_lag_sec=max_lag_sec)


class Recorder:
    """An ASGI app that holds every request until released, and what the middleware sent back."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.entered = 0
        self.fail = False
        self._entry = asyncio.Condition()

    async def entries(self, count: int) -> None:
        async with self._entry:
            await self._entry.wait_for(lambda: self.entered >= count)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        async with self._entry:
            self.entered += 1
            self._entry.notify_all()
        await self.release.wait()
        if self.fail:
            raise RuntimeError("the route failed")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def http(path: str) -> Scope:
    return {"type": "http", "method": "POST", "path": path, "headers": []}


async def call(app: AdmissionLimit, scope: Scope) -> list[Message]:
    sent: list[Message] = []

    async def receive() -> Message:
        raise AssertionError("a refused request's body is never read")

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


def test_beyond_the_limit_a_request_is_refused_503_with_retry_after_and_its_body_unread() -> None:
    async def scenario() -> None:
        inner = Recorder()
        refused: list[tuple[str, Refusal]] = []
        app = AdmissionLimit(
            inner,
            gate=AdmissionGate(max_in_flight=2),
            applies=lambda scope: scope["path"].startswith("/limited"),
            retry_after_sec=5,
            render=lambda scope, why: {"error": why, "path": scope["path"]},
            on_refused=lambda scope, why: refused.append((scope["path"], why)),
        )
        held = [asyncio.create_task(call(app, http("/limited"))) for _ in range(2)]
        await inner.entries(2)
        answer = await call(app, http("/limited/x"))
        assert answer[0]["status"] == 503
        assert (b"retry-after", b"5") in answer[0]["headers"]
        assert json.loads(answer[1]["body"]) == {"error": "busy", "path": "/limited/x"}
        assert refused == [("/limited/x", "busy")]
        other = asyncio.create_task(call(app, http("/open")))  # not selected: never limited
        await inner.entries(3)
        inner.release.set()
        assert [messages[0]["status"] for messages in await asyncio.gather(*held, other)] == [200, 200, 200]
        assert app.gate.status().in_flight == 0
        assert (await call(app, http("/limited")))[0]["status"] == 200  # the slots came back

    asyncio.run(scenario())


def test_a_failing_request_gives_its_slot_back() -> None:
    async def scenario() -> None:
        inner = Recorder()
        inner.fail = True
        inner.release.set()
        gate = AdmissionGate(max_in_flight=1)
        app = AdmissionLimit(inner, gate=gate, applies=lambda _: True, retry_after_sec=1, render=lambda *_: {})
        with pytest.raises(RuntimeError):
            await call(app, http("/x"))
        assert gate.status().in_flight == 0

    asyncio.run(scenario())


def test_each_tenant_and_each_token_within_it_gets_a_bounded_share() -> None:
    gate = AdmissionGate(max_in_flight=8, max_per_tenant=4, max_per_token=2)
    a1, a2, b1 = ("a", "t1"), ("a", "t2"), ("b", "t3")
    assert [gate.try_enter(a1) for _ in range(3)] == [None, None, "token_share"]
    assert [gate.try_enter(a2) for _ in range(3)] == [None, None, "tenant_share"]
    assert [gate.try_enter(b1) for _ in range(2)] == [None, None]  # the other tenant still finds room
    assert gate.try_enter() is None  # a request without an owner counts against the whole only
    gate.leave(a1)
    assert gate.try_enter(a1) is None  # the slot came back to its owner
    status = gate.status()
    assert (status.in_flight, status.tenants_in_flight, status.peak_per_tenant, status.peak_per_token) == (7, 2, 4, 2)
    assert (status.refused_tenant_share_total, status.refused_token_share_total) == (1, 1)
    assert status.busiest_tenants == (("a", 4), ("b", 2))
    for owner in (a1, a1, a2, a2, b1, b1):
        gate.leave(owner)
    assert gate.status().tenants_in_flight == 0  # an owner holding nothing is forgotten
    assert gate.held_by("a") == 0


def test_the_whole_bound_still_holds_when_every_owner_is_under_its_share() -> None:
    gate = AdmissionGate(max_in_flight=3, max_per_tenant=2, max_per_token=2)
    assert [gate.try_enter(owner) for owner in (("a", ""), ("b", ""), ("c", ""), ("d", ""))] == [
        None,
        None,
        None,
        "busy",
    ]


@pytest.mark.parametrize(("tenant", "token"), [(0, None), (None, 0), (-1, 1)])
def test_a_share_must_admit_something(tenant: int | None, token: int | None) -> None:
    with pytest.raises(ValueError, match="share"):
        AdmissionGate(max_in_flight=4, max_per_tenant=tenant, max_per_token=token)
