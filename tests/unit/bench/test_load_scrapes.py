"""The fleet bench's scrapes of ``/metrics``, from a process of their own: a failed one is counted by its error
and the run goes on; a slow beat is held against the scrape it overlapped."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from bench.load_heartbeats import SCRAPER, Fleet, Phase, drift_line, slow_beats_line

from heteroflow.core.testing import free_port


def test_a_failed_scrape_is_counted_the_next_ones_timed_and_a_scraper_that_exits_ends_the_scrapes() -> None:
    # a scraper that answers a refused scrape, then two good ones, then exits
    fake = (
        "import sys\n"
        "for answer in ('HTTPStatusError', 'ok', 'ok'):\n"
        "    sys.stdin.readline()\n"
        "    print(answer, flush=True)\n"
    )

    async def run() -> Phase:
        fleet = Fleet(
            url="http://127.0.0.1:9", agent_token="a", admin_token="b", pid=0, concurrency=1, client="raw",
            scrape_every=0.001,
        )  # fmt: skip
        fleet.scraper_command = [sys.executable, "-c", fake]
        phase = Phase(name="fleet", nodes=1)
        await fleet.scrape(phase, asyncio.Event())  # returns when the scraper is gone
        await fleet.aclose()
        return phase

    phase = asyncio.run(run())
    assert dict(phase.scrape_failures) == {"HTTPStatusError": 1, "scraper exited": 1}
    assert len(phase.scrapes) == 2
    assert [end - start for start, end in phase.scrape_spans] == phase.scrapes


def test_the_scraper_reads_metrics_and_names_a_refusal(tmp_path: Path) -> None:
    (tmp_path / "metrics").write_text("# a scrape's text\n")
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:  # until the server listens
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the file server never listened"
                time.sleep(0.05)
        env = {**os.environ, "HF_SCRAPE_URL": f"http://127.0.0.1:{port}", "HF_SCRAPE_TOKEN": "t"}
        scraper = subprocess.Popen(
            [sys.executable, "-c", SCRAPER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        assert scraper.stdin is not None
        assert scraper.stdout is not None
        scraper.stdin.write("scrape\n")
        scraper.stdin.flush()
        first = scraper.stdout.readline().strip()
        (tmp_path / "metrics").unlink()  # now 404
        scraper.stdin.write("scrape\n")
        scraper.stdin.flush()
        second = scraper.stdout.readline().strip()
        scraper.stdin.close()
        assert scraper.wait(30) == 0
        scraper.stdout.close()
    finally:
        server.kill()
        server.wait(10)
    assert (first, second) == ("ok", "HTTPStatusError")


def test_a_slow_beat_is_held_against_the_scrape_it_overlapped() -> None:
    phase = Phase(name="fleet", nodes=3, seconds=100.0)
    phase.scrape_spans = [(10.0, 11.0), (25.0, 26.0)]  # two scrapes, 2 % of the phase
    # sent before and answered during the first scrape; sent during the second; clear of both
    phase.slow_beats = [(9.99, 10.06), (25.5, 25.6), (40.0, 40.1)]

    line = slow_beats_line(phase)
    assert "fleet: 3 beats over 50 ms, 2 of them during a scrape of /metrics (scrapes took 2.0 % of the phase)" in line
    assert sum(int(part.split(":")[1]) for part in line.split("minute ")[1].split()) == 3  # each in one ten seconds


def test_the_drift_line_holds_the_servers_growth_against_the_load_generators() -> None:
    phase = Phase(name="fleet", nodes=1)
    # a first window left out, then three windows a third: the machine 20 % slower at the end, the server 32 %
    phase.windows = [(9.0, 9.0, 900.0)] + [(0.5, 0.2, 20.0)] * 3 + [(0.6, 0.22, 30.0)] * 3 + [(0.66, 0.24, 40.0)] * 3
    line = drift_line(phase)
    assert "(3 each)" in line
    assert "server CPU/beat x1.32" in line
    assert "the load generator's (the same work per beat) x1.20" in line
    assert "the server's own x1.10" in line
    assert "median window p99 20.0 -> 40.0 ms" in line
