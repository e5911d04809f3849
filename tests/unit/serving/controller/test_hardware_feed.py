"""The hardware-events feed as the controller reads it: the server's own page model, and odd entries one by one.

The server answers with :class:`HardwareFeedPage`; the controller's GPU-health source reads the same page
(``heteroflow.contracts.hardware_events``). An entry it cannot read is one problem: the other entries of the
page, from that node or any other, still raise their faults, and the cursor moves on.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from heteroflow.contracts.hardware_events import FEED_PATH, HardwareFeedEvent, HardwareFeedPage
from heteroflow.core.testing import FakeClock
from heteroflow.serving.controller.monitor.base import Problem, Snapshot, SourceUpdate
from heteroflow.serving.controller.monitor.gpu_health import GpuHealthSource, map_event

AT = datetime(2026, 3, 1, 12, tzinfo=UTC)


def event(node: str, uuid: str | None, kind: str = "xid", value: int = 79, **extra: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "node_id": f"id-{node}",
        "node_name": node,
        "gpu_index": 0,
        "uuid": uuid,
        "kind": kind,
        "value": value,
        "previous": None if kind == "xid" else value - 1,
        "at": AT.isoformat(),
    }
    fields.update(extra)
    return fields


def poll(answers: list[httpx.Response]) -> tuple[list[SourceUpdate], list[httpx.Request], GpuHealthSource]:
    """One poll of a source over ``answers`` (one per page asked for)."""
    requests: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return answers.pop(0)

    source = GpuHealthSource(
        base_url="http://p", token=None, poll_sec=1.0, hold_sec=60.0, clock=FakeClock(),
        transport=httpx.MockTransport(handler),
    )  # fmt: skip
    updates: list[SourceUpdate] = []

    async def run() -> None:
        await source.poll_once(updates.append)
        await source.aclose()

    asyncio.run(run())
    return updates, requests, source


def faults(updates: list[SourceUpdate]) -> list[tuple[str, str, str, int]]:
    (snapshot,) = [u for u in updates if isinstance(u, Snapshot)]
    return sorted((f.node_name, f.card, f.fault_code, f.level) for f in snapshot.faults)


def test_the_servers_page_model_is_what_the_controller_reads() -> None:
    page = HardwareFeedPage(
        source="real",
        events=[
            HardwareFeedEvent.model_validate(event("n1", "GPU-a")),
            HardwareFeedEvent.model_validate(event("n2", None, kind="remap_failure", value=2, gpu_index=3)),
            HardwareFeedEvent.model_validate(event("n3", "GPU-c", value=13)),  # informational
        ],
        next_cursor="4.7",
        more=False,
    )
    answer = httpx.Response(200, content=page.model_dump_json().encode(), headers={"content-type": "application/json"})
    updates, requests, _ = poll([answer])
    assert requests[0].url.path == FEED_PATH
    assert faults(updates) == [("n1", "GPU-a", "XID79", 6), ("n2", "3", "ROW_REMAP_FAILURE", 6)]
    assert not [u for u in updates if isinstance(u, Problem)]


BAD_ENTRIES: list[object] = [
    "not an object",
    event("bad", "GPU-x", value="79"),  # type: ignore[arg-type]  # a number as text is not the XID
    event("bad", "GPU-x", value=True),  # a flag is not a number
    event("bad", "GPU-x", kind="reboot"),
    event("bad", "GPU-x", kind="ecc_uncorrected", previous="4"),
    event("bad", "GPU-x", at="yesterday"),
    event("bad", "GPU-x", card_known="no"),
    event("bad", 17),  # type: ignore[arg-type]
    {key: value for key, value in event("bad", "GPU-x").items() if key != "gpu_index"},
    event("", "GPU-x"),
]


@pytest.mark.parametrize("bad", BAD_ENTRIES)
def test_an_unreadable_entry_is_one_problem_and_the_other_nodes_faults_stand(bad: object) -> None:
    entries = [event("n1", "GPU-a"), bad, event("n2", "GPU-b", kind="ecc_uncorrected", value=3)]
    body = {"source": "real", "events": entries, "next_cursor": "8.8", "more": False}
    answer = httpx.Response(200, json=body)
    updates, _, source = poll([answer])
    problems = [u for u in updates if isinstance(u, Problem)]
    assert len(problems) == 1, problems
    assert faults(updates) == [("n1", "GPU-a", "XID79", 6), ("n2", "GPU-b", "ECC_UNCORRECTABLE", 5)]
    assert source._cursor == "8.8"  # the page was taken: it is not asked for again


@pytest.mark.parametrize("bad", BAD_ENTRIES)
def test_map_event_never_raises_on_an_odd_entry(bad: object) -> None:
    mapped = map_event(bad, source="g")
    assert mapped.report is None
    assert mapped.problem


@pytest.mark.parametrize(
    "envelope",
    [
        {"source": "real", "events": [], "next_cursor": 5, "more": False},
        {"source": "real", "events": [], "next_cursor": "5.5", "more": "false"},
        {"source": "real", "events": {"0": {}}, "next_cursor": "5.5", "more": False},
        {"source": "real", "next_cursor": "5.5", "more": False},
    ],
)
def test_an_unreadable_envelope_is_a_problem_and_the_cursor_stays(envelope: dict[str, Any]) -> None:
    updates, _, source = poll([httpx.Response(200, json=envelope)])
    assert sum(isinstance(u, Problem) for u in updates) == 1
    assert source._cursor is None


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (
            httpx.Response(401, json={"error": "unauthorized", "detail": "no token"}),
            f"{FEED_PATH} answered HTTP 401: no token",
        ),
        (httpx.Response(503, text="down"), f"{FEED_PATH} answered HTTP 503: down"),
        (httpx.Response(200, content=b"<html>"), "not JSON"),
    ],
)
def test_a_refused_poll_is_a_problem_that_says_what_the_platform_answered(answer: httpx.Response, said: str) -> None:
    updates, requests, source = poll([answer])
    (problem,) = [u for u in updates if isinstance(u, Problem)]
    assert said in problem.detail
    assert source._cursor is None
    assert len(requests) == 1
