"""What a finished round's clients saw is asked of the Coordinator over the round's window; a Coordinator that
cannot be asked leaves the counts unknown, never 0."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from datetime import datetime
from typing import Any, cast

from heteroflow.core.testing import FakeClock
from heteroflow.serving.controller import round_clients
from heteroflow.serving.controller.clients import CoordinatorClient, PeerUnavailableError
from heteroflow.serving.controller.history import RoundHistory
from heteroflow.serving.controller.instance import Instance
from heteroflow.serving.controller.ports import PublicationPorts
from tests.unit.serving.controller.helpers import INSTANCE, runtime, topology


class _Coordinator:
    def __init__(self, answer: dict[str, Any] | None) -> None:
        self.answer = answer
        self.asked: list[dict[str, Any]] = []

    async def client_outcomes(self, **query: Any) -> dict[str, Any]:
        self.asked.append(query)
        if self.answer is None:
            raise PeerUnavailableError("GET http://coordinator/coordinator/client_outcomes: connection refused")
        return self.answer


class _Ports:
    def __init__(self, clock: FakeClock, coordinator: _Coordinator | None) -> None:
        self.clock = clock
        self.history = RoundHistory(clock)
        self.coordinator = cast(CoordinatorClient, coordinator) if coordinator is not None else None
        self.tasks: list[asyncio.Task[None]] = []

    def model_of(self, inst: Instance) -> str:
        return "model-a"

    def spawn(self, work: Coroutine[object, object, None], *, name: str) -> None:
        self.tasks.append(asyncio.create_task(work, name=name))


def _ask(coordinator: _Coordinator | None) -> dict[str, Any]:
    async def scenario() -> dict[str, Any]:
        clock = FakeClock()
        ports = _Ports(clock, coordinator)
        inst = Instance(instance_id=INSTANCE, topology=topology(), runtime=runtime())
        fault_at = clock.now().isoformat()
        clock.advance(2.0)
        ports.history.begin("sd-1", instance_id=INSTANCE, kind="scale_down", trigger={"fault_at": fault_at})
        ports.history.finish("sd-1", "committed")
        round_clients.ask_after(cast(PublicationPorts, ports), inst, ["sd-1"])
        await asyncio.sleep(0)
        clock.advance(round_clients.SETTLE_SEC)  # the held requests finish right after the publication
        await asyncio.gather(*ports.tasks)
        record = ports.history.get("sd-1")
        assert record is not None
        assert record.clients is not None
        return record.clients

    return asyncio.run(scenario())


def test_the_coordinator_is_asked_from_the_fault_to_after_the_round_and_its_counts_are_kept() -> None:
    answer = {"held": 2, "rerouted": 1, "resumed": 0, "failed": 1, "longest_wait_sec": 7.5, "complete": True}
    coordinator = _Coordinator(answer)
    clients = _ask(coordinator)
    assert {k: clients[k] for k in answer} == answer
    assert clients["error"] is None
    [query] = coordinator.asked
    assert query["model"] == "model-a"
    assert query["instance_id"] == INSTANCE
    assert query["until"] - query["since"] == 2.0 + round_clients.SETTLE_SEC
    assert datetime.fromisoformat(clients["as_of"]).timestamp() == query["until"]


def test_a_coordinator_that_cannot_be_asked_leaves_the_counts_unknown() -> None:
    clients = _ask(_Coordinator(None))
    assert "connection refused" in clients["error"]
    assert "held" not in clients  # unknown, never 0


def test_without_a_coordinator_the_round_says_so() -> None:
    clients = _ask(None)
    assert clients["error"] == "no Coordinator configured"
