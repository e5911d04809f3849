"""200 streaming requests kept in flight through a real Coordinator while a rank dies and a scale-down round
withdraws it; while the view is withdrawn, a burst beyond the Coordinator's concurrency bound arrives
(:mod:`tests.load.streams` has the set-up and the reasons for it).

Asserted: no request started after the DEL returned reaches a withdrawn endpoint (the dead rank ever, the
survivors before the ADD); the requests on the dying rank end cleanly (an error event, or an error answer after
the retry); every request gets a clear answer (no cut stream, no dropped connection, no 500); beyond
``max_concurrent_requests`` the answer is 503 with Retry-After; the Coordinator's memory stays bounded and it
answers ``/health`` afterwards. Nothing here asserts speed (``bench/load_streams.py`` measures).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import httpx
import pytest

from heteroflow.http.tls import client_tls
from tests.load.streams import Load, Record, clean, endpoint_label, judge, running, sample_rss
from tests.support.polling import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

STREAMS = 200
MAX_TOKENS = 12
LIMIT = 300
"""The Coordinator's max_concurrent_requests here: above the 200 kept in flight, below 200 + the burst."""
BURST = 200
DEAD_RANK = 2
WAIT_SEC = 60
"""The Coordinator's unavailable wait here (default 5 s): the burst arrives while the view is withdrawn, and on a
busy machine that may take longer than 5 s; a request that waited out the default would get a clean 503 too,
but the burst must be in progress together to pass the bound."""
RSS_GROWTH_MIB = 128
"""From before the load to its peak. The Coordinator holds per request in progress a connection each way, a task,
a lease and the event being relayed — tens of KiB — so LIMIT requests cost a few MiB, plus the allocator's
slack; memory that grew with the requests served rather than those in progress would pass it."""


def done_since(records: list[Record], since: float) -> int:
    return sum(1 for r in records if r.outcome == "done" and r.started > since)


def test_streams_through_a_scale_down_never_reach_a_withdrawn_endpoint(tmp_path: Path) -> None:
    async def scenario() -> None:
        env = {
            "HETEROFLOW_COORDINATOR_MAX_CONCURRENT_REQUESTS": str(LIMIT),
            "HETEROFLOW_COORDINATOR_UNAVAILABLE_WAIT_SEC": str(WAIT_SEC),
        }
        async with running(tmp_path, coordinator_env=env) as stack:
            load = Load(stack.url, concurrency=STREAMS + BURST, max_tokens=MAX_TOKENS)
            rss: list[float] = [stack.coordinator_rss_mib()]
            stop, stop_rss = asyncio.Event(), asyncio.Event()
            sampler = asyncio.create_task(sample_rss(stack, rss, stop_rss))
            keeper = asyncio.create_task(load.keep(STREAMS, stop))
            bursts: list[asyncio.Task[list[Record]]] = []

            async def burst_while_withdrawn() -> None:
                # the kept streams now wait for the publication inside the Coordinator; the burst comes on top
                bursts.append(asyncio.create_task(load.burst(BURST, tag="burst")))

                async def refused() -> bool:
                    overloaded: int = (await stack.coordinator_status())["outcomes"]["overloaded"]
                    return overloaded > 0

                await stack.cluster.eventually(refused, within=90, what="requests beyond the bound refused")

            try:
                await eventually(
                    lambda: done_since(load.records, 0) >= STREAMS, within=90, what="a first round of streams"
                )
                round_ = await stack.scale_down(DEAD_RANK, while_withdrawn=burst_while_withdrawn)
                burst = await bursts[0]
                await eventually(
                    lambda: done_since(load.records, round_.add_acked) >= STREAMS,
                    within=90,
                    what="streams served by the survivors",
                )
            finally:
                stop.set()
                await keeper
                stop_rss.set()
                await sampler
            after = await load.one(0, tag="after")
            await load.aclose()
            assert stack.coordinator_alive()
            async with httpx.AsyncClient(base_url=stack.url, verify=client_tls()) as probe:
                assert (await probe.get("/health")).status_code == 200
            metrics = await stack.coordinator_status()
            verdict = judge(load.records, stack.failed_attempts(), round_)

            assert verdict.routed_after_withdrawal == []
            unclear = Counter((r.outcome, r.error[:200]) for r in load.records if not clean(r.outcome))
            assert unclear == Counter(), (unclear, stack.log_path.read_text()[-4000:])
            # every request within the concurrency bound is served: held through the round, resumed if cut
            assert {r.outcome for r in load.records if not r.overloaded} == {"done"}, Counter(
                (r.outcome, r.error[:80]) for r in load.records if r.outcome != "done" and not r.overloaded
            )
            # the dying rank was serving part of the load, and every one of those requests was done elsewhere
            assert sum(verdict.on_dying_rank.values()) > 0
            assert set(verdict.on_dying_rank) == {"done"}
            # beyond the bound: 503 with Retry-After at once, the rest served
            assert any(r.overloaded for r in burst), Counter(r.outcome for r in burst)
            refused = [r for r in load.records if r.overloaded]
            assert all(r.retry_after for r in refused)
            assert metrics["outcomes"]["overloaded"] == len(refused)
            assert after.outcome == "done"
            assert after.endpoint in {endpoint_label(r) for r in stack.published}
            assert max(rss) - rss[0] < RSS_GROWTH_MIB, rss
            print(
                f"requests {len(load.records)}: {dict(Counter(r.outcome for r in load.records))}; "
                f"on the dying rank {dict(verdict.on_dying_rank)} (retried elsewhere "
                f"{verdict.retried_off_dying_rank}); round {round_.timeline()}; burst "
                f"{dict(Counter(r.outcome for r in burst))}; Coordinator RSS MiB start {rss[0]:.0f} "
                f"peak {max(rss):.0f} end {rss[-1]:.0f}"
            )

    asyncio.run(scenario())
