"""Whatever a client sends, the engine answers 2xx or 4xx with a reason, never 500."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heteroflow.engine_sim.testing import FakeEngineCluster

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12,
)
apply_bodies = st.fixed_dictionaries(
    {},
    optional={
        "instruction": st.sampled_from(["scale_down", "retry", "other"]) | json_values,
        "request_id": st.text(max_size=8) | json_values,
        "params": st.fixed_dictionaries(
            {},
            optional={
                "removed_dp_ranks": st.lists(st.integers(-2, 6), max_size=5) | json_values,
                "dp_master_ip": st.text(max_size=10) | json_values,
                "dp_store_port": st.integers(-5, 70000) | json_values,
            },
        )
        | json_values,
    },
)
completion_bodies = st.fixed_dictionaries(
    {},
    optional={
        "prompt": st.text(max_size=30) | st.lists(st.text(max_size=5), max_size=3) | json_values,
        "max_tokens": st.integers(-3, 400) | json_values,
        "model": st.sampled_from(["heteroflow-sim-moe", "other"]) | json_values,
        "stream": st.booleans() | json_values,
        "n": st.integers(0, 3),
        "temperature": st.floats(-1, 3, allow_nan=False),
    },
)


class _Engine:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.cluster = FakeEngineCluster(dp_size=2)
        self.loop.run_until_complete(self.cluster.start())

    def post(self, path: str, body: Any) -> int:
        async def send() -> int:
            resp = await self.cluster.client(0).post(
                path, content=json.dumps(body).encode(), headers={"content-type": "application/json"}
            )
            if resp.status_code >= 400:
                assert resp.json()["error"], "a 4xx carries a reason"
            return resp.status_code

        return self.loop.run_until_complete(send())

    def close(self) -> None:
        self.loop.run_until_complete(self.cluster.close())
        self.loop.close()


@pytest.fixture(scope="module")
def engine() -> Iterator[_Engine]:
    e = _Engine()
    yield e
    e.close()


@settings(max_examples=150, deadline=None)
@given(body=apply_bodies | json_values)
def test_apply_answers_202_or_400(engine: _Engine, body: Any) -> None:
    assert engine.post("/v1/fault_tolerance/apply", body) in (202, 400)


@settings(max_examples=150, deadline=None)
@given(body=completion_bodies | json_values)
def test_completions_answer_200_or_4xx(engine: _Engine, body: Any) -> None:
    assert engine.post("/v1/completions", body) in (200, 400, 404)


@settings(max_examples=50, deadline=None)
@given(body=json_values)
def test_chat_and_fault_routes_answer_4xx_for_garbage(engine: _Engine, body: Any) -> None:
    assert engine.post("/v1/chat/completions", body) in (200, 400, 503)  # 503 if a fault got injected
    assert engine.post("/sim/faults", body) in (202, 400)
