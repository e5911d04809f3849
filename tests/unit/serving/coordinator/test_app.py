"""The Coordinator's routes in process: routing, retry-once, streaming, the unavailable wait, withdrawal races,
management and auth — engines are the in-memory :class:`FakeUpstreams` (no sockets, no sleeps)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from heteroflow.contracts.serving import (
    COORDINATOR_ADD_PATH,
    COORDINATOR_DEL_PATH,
    COORDINATOR_INSTANCES_PATH,
    COORDINATOR_SET_PATH,
)
from heteroflow.serving.coordinator.assembly import create_app
from heteroflow.serving.coordinator.routes import VIEW_OUTCOME_HEADER
from heteroflow.serving.coordinator.service import Coordinator
from heteroflow.serving.coordinator.settings import CoordinatorSettings
from heteroflow.serving.coordinator.testing import (
    TEST_API_KEY,
    TEST_API_KEY_SHA256,
    TEST_CLUSTER_TOKEN,
    EngineMode,
    FakeEngine,
    FakeUpstreams,
)
from tests.support.polling import IN_PROCESS_SEC, eventually

pytestmark = pytest.mark.timeout(20)

MANAGE = {"Authorization": f"Bearer {TEST_CLUSTER_TOKEN}"}
KEY = {"Authorization": f"Bearer {TEST_API_KEY}"}


class Harness:
    def __init__(self, coordinator: Coordinator, upstreams: FakeUpstreams, client: httpx.AsyncClient) -> None:
        self.coordinator = coordinator
        self.upstreams = upstreams
        self.client = client

    def engine(self, endpoint_id: int) -> FakeEngine:
        return self.upstreams.engines[(f"10.0.0.{endpoint_id + 1}", 8000)]

    async def manage(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return await self.client.post(path, headers=MANAGE, json=body)

    async def publish(
        self, ids: tuple[int, ...], *, instance: str = "i1", model: str = "m", generation: int = 0
    ) -> None:
        response = await self.manage(
            COORDINATOR_SET_PATH,
            {
                "instance_id": instance,
                "model": model,
                "generation": generation,
                "endpoints": [{"id": i, "ip": f"10.0.0.{i + 1}", "port": 8000} for i in ids],
            },
        )
        assert response.status_code == 200, response.text

    async def withdraw(self, ids: tuple[int, ...], *, instance: str = "i1") -> httpx.Response:
        response = await self.manage(COORDINATOR_DEL_PATH, {"instance_id": instance, "endpoint_ids": list(ids)})
        assert response.status_code == 200, response.text
        return response

    async def complete(self, *, model: str = "m", stream: bool = False, **extra: Any) -> httpx.Response:
        body = {"model": model, "prompt": "hello", "stream": stream, **extra}
        return await self.client.post("/v1/completions", headers=KEY, json=body)

    def metric(self, text: str) -> float:
        """The value of one sample line of /metrics, e.g. ``heteroflow_coordinator_retries_total{reason="x"}``."""
        body = self.coordinator.metrics.render().decode()
        for line in body.splitlines():
            if line.startswith(text + " "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0


@asynccontextmanager
async def harness(engines: int = 3, **settings: Any) -> AsyncIterator[Harness]:
    upstreams = FakeUpstreams()
    for i in range(engines):
        upstreams.add(f"10.0.0.{i + 1}", 8000, name=f"e{i}")
    values: dict[str, Any] = {
        "cluster_token": TEST_CLUSTER_TOKEN,
        "api_key_hashes": TEST_API_KEY_SHA256,
        "unavailable_wait_sec": 0.2,
        **settings,
    }
    coordinator = Coordinator(settings=CoordinatorSettings.load(**values), upstream_transport=upstreams)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(coordinator)), base_url="http://coord")
    try:
        yield Harness(coordinator, upstreams, client)
    finally:
        await client.aclose()
        await coordinator.aclose()


class _Body(httpx.AsyncByteStream):
    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        self._chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._chunks:
            yield chunk


def run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(scenario())


# -- routing -------------------------------------------------------------------------------------------------
def test_requests_are_routed_by_model_and_spread_over_published_endpoints() -> None:
    async def scenario() -> None:
        async with harness(engines=4) as h:
            await h.publish((0, 1, 2))
            await h.publish((3,), instance="i2", model="other")
            for _ in range(6):
                response = await h.complete()
                assert response.status_code == 200
                assert response.headers["x-request-id"]
            assert [len(h.engine(i).received) for i in range(4)] == [2, 2, 2, 0]
            other = await h.complete(model="other")
            assert other.json()["choices"][0]["text"] == "answer from e3"
            assert h.metric('heteroflow_coordinator_requests_total{outcome="ok",route="completions"}') == 7

    run(scenario)


def test_headers_sent_upstream_carry_the_cluster_token_never_the_api_key() -> None:
    async def scenario() -> None:
        async with harness(engines=1) as h:
            await h.publish((0,))
            headers = {**KEY, "x-request-id": "req-42", "x-custom": "kept", "cookie": "session=1"}
            response = await h.client.post("/v1/completions", headers=headers, json={"model": "m", "prompt": "x"})
            assert response.status_code == 200
            assert response.headers["x-request-id"] == "req-42"
            sent = h.engine(0).received[0].headers
            assert sent["authorization"] == f"Bearer {TEST_CLUSTER_TOKEN}"
            assert TEST_API_KEY not in json.dumps(sent)
            assert sent["x-custom"] == "kept"
            assert sent["x-request-id"] == "req-42"
            assert "cookie" not in sent

    run(scenario)


def test_models_lists_every_known_model_published_or_not() -> None:
    async def scenario() -> None:
        async with harness() as h:
            await h.publish((0,), model="b")
            await h.publish((), instance="i2", model="a")
            response = await h.client.get("/v1/models", headers=KEY)
            assert [m["id"] for m in response.json()["data"]] == ["a", "b"]

    run(scenario)


def test_an_unknown_model_is_an_openai_404() -> None:
    async def scenario() -> None:
        async with harness() as h:
            await h.publish((0,))
            response = await h.complete(model="nope")
            assert response.status_code == 404
            error = response.json()["error"]
            assert error["type"] == "NotFoundError"
            assert error["code"] == 404
            assert "nope" in error["message"]
            assert h.upstreams.total_received() == 0

    run(scenario)


def test_the_least_loaded_endpoint_gets_new_requests() -> None:
    async def scenario() -> None:
        async with harness(engines=2) as h:
            await h.publish((0, 1))
            slow = h.engine(0)
            slow.hold = asyncio.Event()
            first = asyncio.create_task(h.complete())  # round robin sends the first one to e0, which holds it
            await eventually(
                lambda: len(slow.received) == 1, within=5, period=IN_PROCESS_SEC, what="e0 holds a request"
            )
            for _ in range(4):
                assert (await h.complete()).json()["choices"][0]["text"] == "answer from e1"
            slow.release()
            assert (await first).status_code == 200
            assert h.coordinator.status().in_flight == {}

    run(scenario)


def test_every_engine_answer_names_the_endpoint_that_answered() -> None:
    async def scenario() -> None:
        async with harness(engines=2) as h:
            await h.publish((0, 1))
            h.engine(0).mode = EngineMode.REFUSE
            for stream in (False, True, False, True):
                response = await h.complete(stream=stream)
                assert response.status_code == 200
                assert response.headers["x-heteroflow-endpoint"] == "i1/1"  # the retry's endpoint, not the dead one

    run(scenario)


def test_beyond_max_concurrent_requests_a_request_gets_503_with_retry_after_at_once() -> None:
    async def scenario() -> None:
        async with harness(engines=1, max_concurrent_requests=2, retry_after_sec=3) as h:
            await h.publish((0,))
            engine = h.engine(0)
            engine.hold = asyncio.Event()
            held = [asyncio.create_task(h.complete(stream=stream)) for stream in (False, True)]
            await eventually(
                lambda: len(engine.received) == 2,
                within=5,
                period=IN_PROCESS_SEC,
                what="two requests held by the engine",
            )
            anonymous = await h.client.post("/v1/chat/completions", headers={}, content=b"not even read")
            assert anonymous.status_code == 401  # the key is checked before the gate: no slot for it
            refused = await h.client.post("/v1/chat/completions", headers=KEY, content=b"not even read")
            assert refused.status_code == 503
            assert refused.headers["retry-after"] == "3"
            assert refused.json()["error"]["type"] == "ServiceUnavailableError"
            assert len(engine.received) == 2
            assert (await h.client.get("/v1/models", headers=KEY)).status_code == 200  # never limited
            assert h.metric('heteroflow_coordinator_requests_total{outcome="overloaded",route="chat_completions"}') == 1
            engine.release()
            assert [r.status_code for r in await asyncio.gather(*held)] == [200, 200]
            assert (await h.complete()).status_code == 200  # the slots came back
            admission = h.coordinator.status().admission
            assert (admission.in_flight, admission.peak_in_flight, admission.refused_busy_total) == (0, 2, 1)

    run(scenario)


# -- fault answers: re-route and hold (F-41) --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        (EngineMode.UNAVAILABLE, "upstream_503"),
        (EngineMode.INTERNAL_ERROR, "upstream_5xx"),
        (EngineMode.REFUSE, "connect"),
        (EngineMode.DISCONNECT, "disconnect"),
        (EngineMode.ABORT, "abort"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_a_fault_answer_before_the_first_byte_is_sent_elsewhere(mode: EngineMode, reason: str, stream: bool) -> None:
    async def scenario() -> None:
        async with harness(engines=2) as h:
            await h.publish((0, 1))
            h.engine(0).mode = mode
            for _ in range(4):
                response = await h.complete(stream=stream)
                assert response.status_code == 200, response.text
                assert (
                    ("e1#0" in response.text) if stream else response.json()["choices"][0]["text"] == "answer from e1"
                )
                assert "abort" not in response.text
            # after its fault answer the endpoint is skipped by every request for the fault pause
            assert len(h.engine(0).received) <= 1
            assert h.metric(f'heteroflow_coordinator_retries_total{{reason="{reason}"}}') == 1

    run(scenario)


def test_an_aborted_answer_with_partial_text_is_a_fault_and_sent_elsewhere() -> None:
    """Real vLLM 0.32: a request its fault aborted after a few tokens answers 200 with that text and
    ``finish_reason: "abort"``; nothing of it reached the client, so it is sent elsewhere, never passed on."""

    async def scenario() -> None:
        async with harness(engines=2) as h:
            await h.publish((0, 1))
            h.engine(0).mode = EngineMode.ABORT_MID_STREAM
            for _ in range(3):
                response = await h.complete()
                assert response.status_code == 200, response.text
                choice = response.json()["choices"][0]
                assert (choice["text"], choice["finish_reason"]) == ("answer from e1", "length")
            assert len(h.engine(0).received) == 1  # then skipped for the fault pause
            assert h.metric('heteroflow_coordinator_retries_total{reason="abort"}') == 1

    run(scenario)


def test_faults_everywhere_hold_until_the_client_deadline_then_503_with_retry_after() -> None:
    async def scenario() -> None:
        async with harness(engines=3, unavailable_wait_sec=0.3, fault_pause_sec=0.05) as h:
            await h.publish((0, 1, 2))
            for i in range(3):
                h.engine(i).mode = EngineMode.UNAVAILABLE
            started = time.monotonic()
            response = await h.complete()
            assert time.monotonic() - started >= 0.3
            assert response.status_code == 503
            assert response.headers["retry-after"] == "2"
            message = response.json()["error"]["message"]
            assert "client deadline of 0.3 s" in message
            assert "answered 503" in message
            assert all(h.engine(i).received for i in range(3))  # every endpoint was tried, again after its pause
            assert (
                h.metric('heteroflow_coordinator_requests_total{outcome="upstream_unavailable",route="completions"}')
                == 1
            )

    run(scenario)


def test_a_request_held_through_a_fault_is_served_once_the_survivors_are_published() -> None:
    async def scenario() -> None:
        async with harness(engines=3, unavailable_wait_sec=10.0) as h:
            await h.publish((0, 1), generation=1)
            h.engine(0).mode = EngineMode.UNAVAILABLE
            h.engine(1).mode = EngineMode.DISCONNECT
            pending = asyncio.create_task(h.complete())
            await eventually(
                lambda: bool(h.engine(0).received and h.engine(1).received),
                within=5,
                period=IN_PROCESS_SEC,
                what="both tried",
            )
            assert not pending.done()  # held, not answered with an error
            await h.publish((2,), generation=2)  # the survivors (here: another engine) are published
            response = await asyncio.wait_for(pending, 5)
            assert response.status_code == 200
            assert response.json()["choices"][0]["text"] == "answer from e2"

    run(scenario)


def test_a_retry_prefers_another_instance_of_the_model() -> None:
    async def scenario() -> None:
        async with harness(engines=4) as h:
            await h.publish((0, 1))
            await h.publish((2, 3), instance="i2")
            h.engine(0).mode = EngineMode.UNAVAILABLE
            h.engine(1).mode = EngineMode.UNAVAILABLE
            response = await h.complete()  # the first choice is e0 (round-robin from the lowest key)
            assert response.status_code == 200
            assert response.json()["choices"][0]["text"] in ("answer from e2", "answer from e3")
            assert (len(h.engine(0).received), len(h.engine(1).received)) == (1, 0)

    run(scenario)


def test_a_request_on_an_endpoint_reported_faulted_goes_elsewhere_after_the_bound() -> None:
    async def scenario() -> None:
        async with harness(engines=2, faulted_first_byte_sec=0.1) as h:
            await h.publish((0,))
            h.engine(0).mode = EngineMode.HANG  # a released vLLM's new requests hang while it is faulted
            pending = asyncio.create_task(h.complete())
            await eventually(
                lambda: bool(h.engine(0).received), within=5, period=IN_PROCESS_SEC, what="the request reached e0"
            )
            await h.publish((0, 1), generation=1)
            response = await h.manage(
                COORDINATOR_DEL_PATH, {"instance_id": "i1", "endpoint_ids": [0], "faulted": True, "generation": 1}
            )
            assert response.status_code == 200
            # without the faulted first-byte bound the hung request would wait for the 30 s client deadline
            answer = await asyncio.wait_for(pending, 15)
            assert answer.status_code == 200
            assert answer.json()["choices"][0]["text"] == "answer from e1"
            assert h.metric('heteroflow_coordinator_retries_total{reason="faulted_stall"}') == 1

    run(scenario)


def test_a_del_with_a_generation_holds_its_endpoints_back_from_older_or_equal_sets() -> None:
    async def scenario() -> None:
        async with harness(engines=2) as h:
            await h.publish((0, 1), generation=4)
            response = await h.manage(COORDINATOR_DEL_PATH, {"instance_id": "i1", "endpoint_ids": [1], "generation": 5})
            assert response.status_code == 200
            await h.publish((0, 1), generation=5)  # sent before the DEL, delivered after it
            views = (await h.client.get(COORDINATOR_INSTANCES_PATH, headers=MANAGE)).json()["instances"]
            assert [e["id"] for e in views[0]["endpoints"]] == [0]
            assert h.coordinator.status().instances[0].generation == 5
            await h.publish((0, 1), generation=6)
            views = (await h.client.get(COORDINATOR_INSTANCES_PATH, headers=MANAGE)).json()["instances"]
            assert [e["id"] for e in views[0]["endpoints"]] == [0, 1]

    run(scenario)


@pytest.mark.parametrize("stream", [False, True])
def test_an_engine_that_answers_500_once_is_tried_again_and_the_client_never_sees_the_500(stream: bool) -> None:
    """The only engine answers 500 (vLLM's dead engine core) to the first attempt: the request is held for the
    fault pause and sent again; the client gets the answer, never the 500."""

    async def scenario() -> None:
        async with harness(engines=1, fault_pause_sec=0.05) as h:
            await h.publish((0,))
            engine = h.engine(0)
            engine.mode = EngineMode.INTERNAL_ERROR

            async def recovered_after_the_first() -> None:
                if engine.received:  # the first attempt was answered 500: the next one is served
                    engine.mode = EngineMode.OK

            engine.before_headers = recovered_after_the_first
            response = await h.complete(stream=stream)
            assert response.status_code == 200, response.text
            assert ("e0#0" in response.text) if stream else response.json()["choices"][0]["text"] == "answer from e0"
            assert len(engine.received) == 2
            assert h.metric('heteroflow_coordinator_retries_total{reason="upstream_5xx"}') == 1
            assert h.metric('heteroflow_coordinator_requests_total{outcome="upstream_5xx",route="completions"}') == 0

    run(scenario)


def test_engines_that_keep_answering_500_end_in_503_with_retry_after_never_500() -> None:
    async def scenario() -> None:
        async with harness(engines=2, unavailable_wait_sec=0.3, fault_pause_sec=0.05) as h:
            await h.publish((0, 1))
            for i in range(2):
                h.engine(i).mode = EngineMode.INTERNAL_ERROR
            response = await h.complete(stream=True)
            assert response.status_code == 503, response.text
            assert response.headers["retry-after"] == "2"
            assert "answered 500 (engine error: EngineCore encountered an issue)" in response.json()["error"]["message"]
            assert all(h.engine(i).received for i in range(2))

    run(scenario)


def test_an_upstream_4xx_is_passed_through_unchanged_without_retry() -> None:
    async def scenario() -> None:
        async with harness(engines=2) as h:
            await h.publish((0, 1))
            h.engine(0).mode = EngineMode.REJECT
            h.engine(1).mode = EngineMode.REJECT
            response = await h.complete()
            assert response.status_code == 400
            assert response.json()["error"]["message"].startswith("rejected by e")
            assert h.upstreams.total_received() == 1
            assert h.metric('heteroflow_coordinator_requests_total{outcome="upstream_4xx",route="completions"}') == 1

    run(scenario)


# -- streaming -----------------------------------------------------------------------------------------------
def events(text: str) -> list[str]:
    return [block.removeprefix("data: ") for block in text.split("\n\n") if block]


def test_a_stream_is_passed_through_event_by_event() -> None:
    async def scenario() -> None:
        async with harness(engines=1) as h:
            await h.publish((0,))
            response = await h.complete(stream=True)
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            got = events(response.text)
            assert got[-1] == "[DONE]"
            assert [json.loads(e)["choices"][0]["text"] for e in got[:-1]] == ["e0#0", "e0#1", "e0#2", ""]

    run(scenario)


@pytest.mark.parametrize(
    "mode",
    [EngineMode.FAIL_MID_STREAM, EngineMode.ERROR_MID_STREAM, EngineMode.ABORT_MID_STREAM, EngineMode.DONE_MID_STREAM],
)
def test_a_stream_cut_midway_is_resumed_on_a_survivor_and_spliced(mode: EngineMode) -> None:
    async def scenario() -> None:
        async with harness(engines=2) as h:
            await h.publish((0, 1))
            h.engine(0).mode = mode
            response = await h.complete(stream=True, max_tokens=8, temperature=0)
            assert response.status_code == 200
            got = events(response.text)
            assert got[-1] == "[DONE]"
            payloads = [json.loads(e) for e in got[:-1]]
            assert all("error" not in p for p in payloads)
            assert {p["id"] for p in payloads} == {"cmpl-e0"}  # one stream, one id
            texts = [p["choices"][0]["text"] for p in payloads]
            assert texts[:2] == ["e0#0", "e1#0"]
            finishes = [p["choices"][0]["finish_reason"] for p in payloads if p["choices"][0]["finish_reason"]]
            assert finishes == ["length"]
            continuation = h.engine(1).received[0].body
            assert continuation["prompt"] == "hello" + "e0#0"
            assert continuation["max_tokens"] == 7
            assert continuation["temperature"] == 0
            assert continuation["stream"] is True
            assert h.metric('heteroflow_coordinator_stream_continuations_total{outcome="resumed"}') == 1
            assert h.metric('heteroflow_coordinator_requests_total{outcome="resumed",route="completions"}') == 1
            assert h.coordinator.status().in_flight == {}

    run(scenario)


def test_a_cut_chat_stream_continues_the_partial_assistant_message_with_one_role_event() -> None:
    async def scenario() -> None:
        async with harness(engines=2) as h:
            await h.publish((0, 1))
            h.engine(0).mode = EngineMode.ERROR_MID_STREAM
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 5}
            response = await h.client.post("/v1/chat/completions", headers=KEY, json=body)
            got = events(response.text)
            assert got[-1] == "[DONE]"
            payloads = [json.loads(e) for e in got[:-1]]
            assert {p["id"] for p in payloads} == {"cmpl-e0"}
            deltas = [p["choices"][0]["delta"] for p in payloads]
            assert sum(1 for d in deltas if "role" in d) == 1  # the continuation's role event is dropped
            assert "".join(d.get("content", "") for d in deltas) == "e0#0e1#0e1#1e1#2"
            sent = h.engine(1).received[0].body
            assert sent["messages"][-1] == {"role": "assistant", "content": "e0#0"}
            assert sent["continue_final_message"] is True
            assert sent["add_generation_prompt"] is False
            assert sent["max_tokens"] == 4

    run(scenario)


def test_a_stream_stalled_on_an_endpoint_reported_faulted_is_resumed_after_the_bound() -> None:
    async def scenario() -> None:
        async with harness(engines=2, faulted_first_byte_sec=0.1) as h:
            await h.publish((0, 1))
            gate = asyncio.Event()
            h.engine(0).events = 3
            original = h.upstreams.handle_async_request

            async def stalling(request: httpx.Request) -> httpx.Response:
                response = await original(request)
                if request.url.host != "10.0.0.1":
                    return response
                chunks = [chunk async for chunk in response.aiter_raw()]

                async def body() -> AsyncIterator[bytes]:
                    yield chunks[0]
                    await gate.wait()  # the engine stops sending: a released vLLM's faulted engine

                return httpx.Response(200, headers=response.headers, stream=_Body(body()))

            h.upstreams.handle_async_request = stalling  # type: ignore[method-assign]
            pending = asyncio.create_task(h.complete(stream=True))
            await eventually(
                lambda: bool(h.engine(0).received), within=5, period=IN_PROCESS_SEC, what="the stream started on e0"
            )
            await h.manage(COORDINATOR_DEL_PATH, {"instance_id": "i1", "endpoint_ids": [0], "faulted": True})
            response = await asyncio.wait_for(pending, 5)
            texts = [json.loads(e)["choices"][0]["text"] for e in events(response.text)[:-1]]
            assert texts[:2] == ["e0#0", "e1#0"]
            assert all("error" not in e for e in events(response.text)[:-1])
            gate.set()

    run(scenario)


def test_a_cut_stream_that_cannot_be_continued_ends_with_an_error_event_and_done() -> None:
    async def scenario() -> None:
        async with harness(engines=2) as h:
            await h.publish((0, 1))
            h.engine(0).mode = EngineMode.FAIL_MID_STREAM
            response = await h.complete(stream=True, logprobs=2)
            got = events(response.text)
            assert json.loads(got[0])["choices"][0]["text"] == "e0#0"
            error = json.loads(got[1])["error"]["message"]
            assert "cannot be resumed elsewhere because it asks for logprobs" in error
            assert got[2:] == ["[DONE]"]
            assert h.upstreams.total_received() == 1
            assert h.metric('heteroflow_coordinator_requests_total{outcome="stream_error",route="completions"}') == 1
            assert h.coordinator.status().in_flight == {}

    run(scenario)


@pytest.mark.parametrize("chunk_size", [1, 7, 1000])
def test_events_straddling_chunks_are_relayed_whole(chunk_size: int) -> None:
    async def scenario() -> None:
        async with harness(engines=1) as h:
            await h.publish((0,))
            h.engine(0).chunk_size = chunk_size
            response = await h.complete(stream=True)
            got = events(response.text)
            assert [json.loads(e)["choices"][0]["text"] for e in got[:-1]] == ["e0#0", "e0#1", "e0#2", ""]
            assert got[-1] == "[DONE]"

    run(scenario)


def test_an_event_cut_by_the_failure_is_dropped_never_delivered_half() -> None:
    async def scenario() -> None:
        async with harness(engines=1) as h:  # no survivor: the continuation gives up at the client deadline
            await h.publish((0,))
            h.engine(0).mode = EngineMode.FAIL_MID_STREAM
            h.engine(0).chunk_size = 7
            response = await h.complete(stream=True)
            got = events(response.text)
            assert len(got) == 3
            assert json.loads(got[0])["choices"][0]["text"] == "e0#0"
            assert "could not be resumed" in json.loads(got[1])["error"]["message"]
            assert got[2] == "[DONE]"

    run(scenario)


def test_a_stream_that_cannot_start_is_retried() -> None:
    async def scenario() -> None:
        async with harness(engines=2) as h:
            await h.publish((0, 1))
            h.engine(0).mode = EngineMode.UNAVAILABLE
            for _ in range(2):
                response = await h.complete(stream=True)
                assert events(response.text)[-1] == "[DONE]"
                assert "e1#0" in response.text

    run(scenario)


# -- the unavailable wait --------------------------------------------------------------------------------------
def test_an_empty_view_answers_503_with_retry_after_once_the_wait_is_over() -> None:
    async def scenario() -> None:
        async with harness(unavailable_wait_sec=0.3) as h:
            await h.publish((0,))
            await h.withdraw((0,))
            started = time.monotonic()
            response = await h.complete()
            assert time.monotonic() - started >= 0.3
            assert response.status_code == 503
            assert response.headers["retry-after"] == "2"
            assert "no endpoint of model 'm' is published" in response.json()["error"]["message"]

    run(scenario)


def test_a_request_waiting_for_a_publication_is_served_when_it_comes() -> None:
    async def scenario() -> None:
        async with harness(unavailable_wait_sec=10.0) as h:
            await h.publish((0, 1))
            await h.withdraw((0, 1))
            waiting = asyncio.create_task(h.complete())
            await eventually(
                lambda: h.coordinator.status().waiting_for_publication == 1,
                within=5,
                period=IN_PROCESS_SEC,
                what="request waits",
            )
            add = await h.manage(
                COORDINATOR_ADD_PATH,
                {"instance_id": "i1", "model": "m", "endpoints": [{"id": 1, "ip": "10.0.0.2", "port": 8000}]},
            )
            assert add.status_code == 200
            response = await waiting
            assert response.status_code == 200
            assert response.json()["choices"][0]["text"] == "answer from e1"
            assert len(h.engine(0).received) == 0

    run(scenario)


# -- withdrawal races (F-41: never route to a withdrawn endpoint) ------------------------------------------------
def test_an_endpoint_withdrawn_between_choice_and_send_receives_nothing() -> None:
    async def scenario() -> None:
        async with harness(engines=2) as h:
            await h.publish((0, 1))
            victim = h.engine(0)

            async def withdraw_now() -> None:
                victim.before_headers = None
                await h.withdraw((0,))

            victim.before_headers = withdraw_now  # the DEL lands after e0 was chosen, before its headers go out
            response = await h.complete()
            assert response.status_code == 200
            assert response.json()["choices"][0]["text"] == "answer from e1"
            assert victim.received == []
            assert h.metric('heteroflow_coordinator_retries_total{reason="upstream_503"}') == 0

    run(scenario)


def test_a_withdrawal_returns_only_after_headers_being_written_are_out() -> None:
    async def scenario() -> None:
        async with harness(engines=1) as h:
            await h.publish((0,))
            engine = h.engine(0)
            engine.headers_gate = asyncio.Event()
            request = asyncio.create_task(h.complete())
            await eventually(
                lambda: bool(h.coordinator.views.status().sending),
                within=5,
                period=IN_PROCESS_SEC,
                what="headers being written",
            )
            withdrawal = asyncio.create_task(h.withdraw((0,)))
            for _ in range(50):
                await asyncio.sleep(0)
            assert not withdrawal.done()  # still writing to e0: the DEL has not returned yet
            engine.headers_gate.set()
            await withdrawal
            assert (await request).status_code == 200  # in flight before the DEL returned: it may finish
            assert len(engine.received) == 1

    run(scenario)


# -- management ----------------------------------------------------------------------------------------------
def test_management_answers_are_view_responses_with_the_outcome() -> None:
    async def scenario() -> None:
        async with harness() as h:
            await h.publish((0, 1), generation=3)
            stale = await h.manage(
                COORDINATOR_SET_PATH,
                {"instance_id": "i1", "model": "m", "generation": 2, "endpoints": []},
            )
            assert stale.status_code == 200
            assert stale.headers[VIEW_OUTCOME_HEADER] == "stale_generation"
            assert [e["id"] for e in stale.json()["instances"][0]["endpoints"]] == [0, 1]
            assert stale.json()["instances"][0]["generation"] == 3
            unknown = await h.manage(COORDINATOR_DEL_PATH, {"instance_id": "ghost", "endpoint_ids": [1]})
            assert unknown.headers[VIEW_OUTCOME_HEADER] == "unknown_instance"
            listed = await h.client.get(COORDINATOR_INSTANCES_PATH, headers=MANAGE)
            assert listed.json() == stale.json()
            assert h.coordinator.status().stale_generations_ignored == 1
            assert h.metric('heteroflow_coordinator_published_endpoints{instance="i1",model="m"}') == 2
            assert h.metric('heteroflow_coordinator_view_operations_total{op="SET",outcome="stale_generation"}') == 1

    run(scenario)


@pytest.mark.parametrize("ip", ["10.0.0.1/evil", "user@10.0.0.1", "a b", "-bad", "10.0.0.1:80"])
def test_an_endpoint_address_that_is_no_host_is_400(ip: str) -> None:
    async def scenario() -> None:
        async with harness() as h:
            body = {"instance_id": "i1", "model": "m", "endpoints": [{"id": 0, "ip": ip, "port": 8000}]}
            for path in (COORDINATOR_ADD_PATH, COORDINATOR_SET_PATH):
                response = await h.client.post(path, headers=MANAGE, json=body)
                assert response.status_code == 400
                assert "not an IP address or host name" in response.json()["detail"]
            assert h.coordinator.views.snapshot() == ()

    run(scenario)


def test_view_details_survive_any_instance_id() -> None:
    async def scenario() -> None:
        async with harness() as h:
            await h.publish((0,), instance="实例-1")
            response = await h.manage(COORDINATOR_DEL_PATH, {"instance_id": "实例-1", "endpoint_ids": [0, 5]})
            assert response.status_code == 200
            assert "5" in response.headers["x-heteroflow-view-detail"]
            assert response.json()["instances"][0]["instance_id"] == "实例-1"

    run(scenario)


def test_add_for_another_model_is_409() -> None:
    async def scenario() -> None:
        async with harness() as h:
            await h.publish((0,))
            response = await h.manage(
                COORDINATOR_ADD_PATH,
                {"instance_id": "i1", "model": "other", "endpoints": [{"id": 1, "ip": "10.0.0.2", "port": 8000}]},
            )
            assert response.status_code == 409
            assert response.json()["error"] == "model_mismatch"

    run(scenario)


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b'{"instance_id": "i1"}',
        b'{"instance_id": "i1", "endpoint_ids": [1, 1]}',
        b'{"instance_id": "i1", "endpoint_ids": [-1]}',
        b'{"instance_id": "i1", "endpoint_ids": [], "extra": 1}',
    ],
)
def test_a_malformed_management_body_is_400(body: bytes) -> None:
    async def scenario() -> None:
        async with harness() as h:
            response = await h.client.post(COORDINATOR_DEL_PATH, headers=MANAGE, content=body)
            assert response.status_code == 400
            assert response.json()["error"] == "invalid_body"
            assert response.json()["detail"]

    run(scenario)


# -- auth ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", COORDINATOR_DEL_PATH),
        ("POST", COORDINATOR_ADD_PATH),
        ("POST", COORDINATOR_SET_PATH),
        ("GET", COORDINATOR_INSTANCES_PATH),
        ("GET", "/metrics"),
    ],
)
@pytest.mark.parametrize("token", [None, "wrong", TEST_API_KEY])
def test_management_and_metrics_need_the_cluster_token(method: str, path: str, token: str | None) -> None:
    async def scenario() -> None:
        async with harness() as h:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            response = await h.client.request(method, path, headers=headers, json={})
            assert response.status_code == 401
            assert response.headers["www-authenticate"] == "Bearer"
            assert response.json()["error"] == "unauthorized"

    run(scenario)


def test_without_a_cluster_token_management_is_closed() -> None:
    async def scenario() -> None:
        async with harness(cluster_token=None) as h:
            response = await h.client.get(COORDINATOR_INSTANCES_PATH, headers=MANAGE)
            assert response.status_code == 401
            assert "no cluster token is configured" in response.json()["detail"]
            assert (await h.client.get("/health")).status_code == 200

    run(scenario)


@pytest.mark.parametrize("header", [None, "Bearer wrong", f"Basic {TEST_API_KEY}", f"Bearer {TEST_CLUSTER_TOKEN}"])
def test_openai_routes_need_an_api_key(header: str | None) -> None:
    async def scenario() -> None:
        async with harness() as h:
            await h.publish((0,))
            headers = {"Authorization": header} if header else {}
            for response in (
                await h.client.post("/v1/completions", headers=headers, json={"model": "m", "prompt": "x"}),
                await h.client.post("/v1/chat/completions", headers=headers, json={"model": "m", "messages": []}),
                await h.client.get("/v1/models", headers=headers),
            ):
                assert response.status_code == 401
                assert response.json()["error"]["type"] == "AuthenticationError"
            assert h.upstreams.total_received() == 0

    run(scenario)


def test_without_any_key_source_every_openai_request_is_refused() -> None:
    async def scenario() -> None:
        async with harness(api_key_hashes="") as h:
            await h.publish((0,))
            response = await h.complete()
            assert response.status_code == 401
            assert "no API key is configured" in response.json()["error"]["message"]

    run(scenario)


def test_chat_completions_are_forwarded_to_the_chat_route() -> None:
    async def scenario() -> None:
        async with harness(engines=1) as h:
            await h.publish((0,))
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            response = await h.client.post("/v1/chat/completions", headers=KEY, json=body)
            assert response.status_code == 200
            assert h.engine(0).received[0].path == "/v1/chat/completions"

    run(scenario)


# -- body validation through the route ------------------------------------------------------------------------
async def _chunks(size: int) -> AsyncIterator[bytes]:
    yield b'{"model": "m", "prompt": "'
    for _ in range(size // 1024):
        yield b"x" * 1024
    yield b'"}'


@pytest.mark.parametrize(
    ("content", "status", "message"),
    [
        (b"{bad", 400, "not valid JSON"),
        (b'{"prompt": "x"}', 400, "'model' is required"),
        (b'{"model": "m", "x": ' + b"[" * 100 + b"]" * 100 + b"}", 400, "nested deeper"),
        (json.dumps({"model": "m", "prompt": "x" * 5000}).encode(), 413, "larger than 4096 bytes"),
        ("chunked", 413, "larger than 4096 bytes"),
    ],
)
def test_bad_bodies_are_4xx_and_reach_no_engine(content: bytes | str, status: int, message: str) -> None:
    async def scenario() -> None:
        async with harness(max_body_bytes=4096) as h:
            await h.publish((0,))
            payload: Any = _chunks(10_000) if content == "chunked" else content
            response = await h.client.post("/v1/completions", headers=KEY, content=payload)
            assert response.status_code == status
            assert message in response.json()["error"]["message"]
            assert h.upstreams.total_received() == 0
            assert h.metric('heteroflow_coordinator_requests_total{outcome="bad_request",route="completions"}') == 1

    run(scenario)


@pytest.mark.parametrize(
    ("length", "status", "message"),
    [
        # '²' is a digit to str.isdigit() but not to int(), and int() refuses thousands of digits: both were a 500
        (b"\xb2", 400, "not a number"),
        (b"9" * 5000, 413, "larger than 4096 bytes"),
        (b"-1", 400, "not a number"),
    ],
)
@pytest.mark.parametrize("path", ["/v1/completions", COORDINATOR_SET_PATH])
def test_a_content_length_that_is_no_length_is_4xx(length: bytes, status: int, message: str, path: str) -> None:
    async def scenario() -> None:
        async with harness(max_body_bytes=4096) as h:
            auth = KEY if path.startswith("/v1/") else MANAGE
            headers = {name.encode(): value.encode() for name, value in auth.items()} | {b"content-length": length}
            response = await h.client.post(path, headers=headers, content=b'{"model": "m"}')
            body = response.json()
            found = body["error"]["message"] if path.startswith("/v1/") else body["detail"]
            assert response.status_code == (status if path.startswith("/v1/") else 400), found
            assert message in found
            assert h.upstreams.total_received() == 0

    run(scenario)


def test_a_lone_surrogate_model_name_is_a_4xx_that_can_be_written_back() -> None:
    """``"model": "\\ud800"`` made the unknown-model answer fail to encode: a 500."""

    async def scenario() -> None:
        async with harness(engines=1) as h:
            await h.publish((0,))
            for path in ("/v1/completions", "/v1/chat/completions"):
                raw = b'{"model": "\\ud800", "prompt": "x", "messages": [{"role": "user", "content": "x"}]}'
                response = await h.client.post(path, headers={**KEY, "content-type": "application/json"}, content=raw)
                assert 400 <= response.status_code < 500, response.text
                json.loads(response.content)["error"]["message"].encode("utf-8")
            assert h.upstreams.total_received() == 0

    run(scenario)


# -- the management listener (a loop of its own) ----------------------------------------------------------------
def test_management_calls_from_another_loop_wake_held_requests_and_bound_faulted_ones() -> None:
    from heteroflow.serving.coordinator.assembly import create_management_app

    async def scenario() -> None:
        async with harness(engines=2, faulted_first_byte_sec=0.1, unavailable_wait_sec=10.0) as h:
            h.coordinator.main_loop = asyncio.get_running_loop()
            management = create_management_app(h.coordinator)

            def call(path: str, body: dict[str, Any]) -> int:
                async def post() -> int:
                    transport = httpx.ASGITransport(app=management)
                    async with httpx.AsyncClient(transport=transport, base_url="http://manage") as client:
                        return (await client.post(path, headers=MANAGE, json=body)).status_code

                return asyncio.run(post())  # the management listener's own loop, in another thread

            endpoint = {"id": 0, "ip": "10.0.0.1", "port": 8000}
            h.engine(0).mode = EngineMode.HANG
            await h.publish(())  # known model, nothing published: requests are held
            pending = asyncio.create_task(h.complete())
            await eventually(
                lambda: h.coordinator.publications.waiting == 1,
                within=5,
                period=IN_PROCESS_SEC,
                what="the request held",
            )
            body = {"instance_id": "i1", "model": "m", "generation": 1, "endpoints": [endpoint]}
            assert await asyncio.to_thread(call, COORDINATOR_SET_PATH, body) == 200
            await eventually(
                lambda: bool(h.engine(0).received),
                within=5,
                period=IN_PROCESS_SEC,
                what="the held request sent once published",
            )
            other = {"id": 1, "ip": "10.0.0.2", "port": 8000}
            body = {"instance_id": "i1", "model": "m", "generation": 2, "endpoints": [endpoint, other]}
            assert await asyncio.to_thread(call, COORDINATOR_SET_PATH, body) == 200
            fault = {"instance_id": "i1", "endpoint_ids": [0], "faulted": True, "generation": 2}
            assert await asyncio.to_thread(call, COORDINATOR_DEL_PATH, fault) == 200
            response = await asyncio.wait_for(pending, 5)
            assert response.json()["choices"][0]["text"] == "answer from e1"
            anonymous = {"instance_id": "i1", "endpoint_ids": [1]}
            assert await asyncio.to_thread(call_unauthenticated, management, anonymous) == 401

    run(scenario)


def call_unauthenticated(app: Any, body: dict[str, Any]) -> int:
    async def post() -> int:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://manage") as client:
            return (await client.post(COORDINATOR_DEL_PATH, json=body)).status_code

    return asyncio.run(post())


def test_a_connection_closed_under_the_transport_stack_is_a_fault_answer_never_a_500() -> None:
    # what anyio raises when the engine closes a connection httpcore is still opening (its socket is gone when
    # httpcore asks for the TLS attributes): not an httpx error, so it was the client's 500
    async def closed_while_opening() -> None:
        raise AttributeError("'NoneType' object has no attribute 'getpeername'")

    async def scenario() -> None:
        async with harness(engines=2) as h:
            await h.publish((0, 1))
            h.engine(0).before_headers = closed_while_opening
            for stream in (False, True, False, True):
                response = await h.complete(stream=stream)
                assert response.status_code == 200, response.text
                assert "e1" in response.text
            assert h.metric('heteroflow_coordinator_retries_total{reason="disconnect"}') >= 1

    run(scenario)
