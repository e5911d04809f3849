"""The fleet bench's scrapes of ``/metrics``: a failed one is counted by its error and the run goes on."""

from __future__ import annotations

import asyncio

import httpx
from bench.load_heartbeats import Fleet, Phase, slow_beats_line


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


def test_a_slow_beat_is_held_against_the_scrape_it_overlapped() -> None:
    phase = Phase(name="fleet", nodes=3, seconds=100.0)
    phase.scrape_spans = [(10.0, 11.0), (25.0, 26.0)]  # two scrapes, 2 % of the phase
    # sent before and answered during the first scrape; sent during the second; clear of both
    phase.slow_beats = [(9.99, 10.06), (25.5, 25.6), (40.0, 40.1)]

    line = slow_beats_line(phase)
    assert "fleet: 3 beats over 50 ms, 2 of them during a scrape of /metrics (scrapes took 2.0 % of the phase)" in line
    assert sum(int(part.split(":")[1]) for part in line.split("minute ")[1].split()) == 3  # each in one ten seconds
