"""The fleet bench's scrapes of ``/metrics``: a failed one is counted by its error and the run goes on."""

from __future__ import annotations

import asyncio

import httpx
from bench.load_heartbeats import Fleet, Phase


def test_a_failed_scrape_is_counted_and_the_next_one_is_timed() -> None:
    statuses = [503, 200, 200]  # the server refused the first scrape, then answered two
    asked: list[str] = []
    third = asyncio.Event()

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        if len(asked) == len(statuses):
            third.set()
        return httpx.Response(statuses[min(len(asked), len(statuses)) - 1], text="# metrics\n")

    async def run() -> Phase:
        fleet = Fleet(
            url="http://127.0.0.1:9", agent_token="a", admin_token="b", pid=0, concurrency=1, client="raw",
            scrape_every=0.001,
        )  # fmt: skip
        await fleet.admin.aclose()
        fleet.admin = httpx.AsyncClient(base_url=fleet.url, transport=httpx.MockTransport(handler))
        phase, stop = Phase(name="fleet", nodes=1), asyncio.Event()
        scraping = asyncio.create_task(fleet.scrape(phase, stop))
        await third.wait()
        stop.set()  # the scrape in flight ends and is timed; no other begins
        await scraping
        await fleet.aclose()
        return phase

    phase = asyncio.run(run())
    assert asked == ["/metrics"] * 3
    assert dict(phase.scrape_failures) == {"HTTPStatusError": 1}
    assert len(phase.scrapes) == 2
    assert all(seconds >= 0 for seconds in phase.scrapes)
