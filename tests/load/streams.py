"""Streaming requests through a real Coordinator process while a rank dies and a scale-down round withdraws it.

Shared by ``tests/load/test_stream_load.py`` (a short run, behaviour asserted) and ``bench/load_streams.py``
(figures). The processes are real: ``heteroflow coordinator`` (its JSON log kept in a file) in front of one DP-4
``heteroflow engine-sim`` instance (:class:`~heteroflow.engine_sim.testing.SimProcessCluster`: torch workers in
a gloo group, so a dead rank really breaks its peers' collectives and the survivors really rebuild).

The controller's part of the round is played by :meth:`Stack.scale_down` with the calls the controller makes,
in its order (``docs/controller.md``): the survivors report unhealthy → DEL of the instance's whole published
view → ``scale_down`` applied to every survivor → survivors healthy → ADD of the survivors. The controller's
guards, write-ahead records and probes are left out: the Coordinator sees exactly those DEL and ADD calls, and
the controller's own timing is ``bench/recovery.py``'s subject. A whole local cluster (controller, NodeManagers,
platform server: 15 processes) would make the same DEL and ADD calls at two to three times the start-up cost on
two shared cores.

Which endpoint a request reached: an engine's answer carries ``X-HeteroFlow-Endpoint``; an attempt that failed
(and was retried or answered with an error) is in the Coordinator's log as ``coordinator.upstream_failed`` with
the endpoint and the request id, which the client chooses (``X-Request-Id``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from heteroflow.contracts.serving import COORDINATOR_ADD_PATH, COORDINATOR_DEL_PATH, COORDINATOR_SET_PATH
from heteroflow.core.testing import free_port
from heteroflow.engine_sim import conformance
from heteroflow.engine_sim.testing import SimProcessCluster, rss_kib
from heteroflow.http.tls import client_tls
from heteroflow.serving.coordinator.settings import CoordinatorSettings
from heteroflow.serving.coordinator.testing import TEST_API_KEY, TEST_API_KEY_SHA256

INSTANCE = "inst-1"
MODEL = "heteroflow-sim-moe"
OVERLOADED_MESSAGE = "handling as many requests as it is configured for"
"""Part of the Coordinator's answer beyond max_concurrent_requests."""
POOL_SIZE = 32
"""Connections per ``httpx`` client of the load generator (httpx scans its whole pool on every request)."""


@dataclass
class Record:
    """One streaming request as the client saw it. Times are wall-clock seconds (``time.time()``), comparable
    with the Coordinator's log timestamps on the same machine."""

    request_id: str
    started: float
    first_byte: float | None = None
    ended: float | None = None
    status: int | None = None
    endpoint: str | None = None
    """``X-HeteroFlow-Endpoint``: the endpoint whose engine answered."""
    outcome: str = "pending"
    """``done`` (``[DONE]`` received), ``error_event`` (an error event ended the stream), ``cut`` (ended with
    neither), ``http_<status>`` (no stream: an error answer), or ``transport:<error>``."""
    retry_after: str | None = None
    error: str = ""
    """The error message of an error answer (its start)."""
    events: int = 0

    @property
    def overloaded(self) -> bool:
        """Refused by the Coordinator's concurrency bound (not by a lack of endpoints)."""
        return self.status == 503 and OVERLOADED_MESSAGE in self.error

    @property
    def seconds(self) -> float:
        return (self.ended or self.started) - self.started


@dataclass
class Round:
    """Wall-clock times of one scale-down round as the controller would run it."""

    rank: int
    killed: float = 0.0
    detected: float = 0.0
    del_sent: float = 0.0
    del_acked: float = 0.0
    applied: float = 0.0
    healthy: float = 0.0
    add_sent: float = 0.0
    add_acked: float = 0.0

    def timeline(self) -> dict[str, float]:
        """Seconds from the kill to each step."""
        steps = ("detected", "del_sent", "del_acked", "applied", "healthy", "add_sent", "add_acked")
        return {step: round(getattr(self, step) - self.killed, 3) for step in steps}


@dataclass
class Attempt:
    """A failed upstream attempt, from the Coordinator's log."""

    at: float
    request_id: str
    endpoint: str
    reason: str
    will_retry: bool


def endpoint_label(rank: int) -> str:
    return f"{INSTANCE}/{rank}"


class Stack:
    """The engines and the Coordinator, started together and killed together."""

    def __init__(self, workdir: Path, *, dp_size: int = 4, coordinator_env: dict[str, str] | None = None) -> None:
        self.workdir = workdir
        self.cluster = SimProcessCluster(dp_size=dp_size, log_dir=workdir / "engines")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.management_port = free_port()
        """The Coordinator's management listener (a thread and loop of its own): DEL/ADD/SET go there."""
        self.log_path = workdir / "coordinator.log"
        self._coordinator_env = coordinator_env or {}
        self.coordinator: subprocess.Popen[bytes] | None = None
        self.published = list(self.cluster.ports)
        auth = {"Authorization": f"Bearer {self.cluster.cluster_token}"}
        self.manage = httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{self.management_port}", headers=auth, timeout=30, verify=client_tls()
        )
        self.scrape = httpx.AsyncClient(base_url=self.url, headers=auth, timeout=30, verify=client_tls())

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HETEROFLOW_")}
        pool = self._coordinator_env.get(
            "HETEROFLOW_COORDINATOR_MAX_CONCURRENT_REQUESTS",
            str(CoordinatorSettings.model_fields["max_concurrent_requests"].default),
        )
        log = self.log_path.open("ab")
        self.coordinator = subprocess.Popen(  # the engines start meanwhile: both take seconds on two cores
            [sys.executable, "-m", "heteroflow", "coordinator", "--port", str(self.port)],
            env={
                **env,
                "HETEROFLOW_CLUSTER_TOKEN": self.cluster.cluster_token,
                "HETEROFLOW_COORDINATOR_API_KEY_HASHES": TEST_API_KEY_SHA256,
                "HETEROFLOW_COORDINATOR_LOG_LEVEL": "info",
                "HETEROFLOW_COORDINATOR_MANAGEMENT_PORT": str(self.management_port),
                # the whole load comes through one key, so that key's share is the whole pool: the bound that
                # is measured and asserted is the Coordinator's, not one tenant's (docs/coordinator.md)
                "HETEROFLOW_COORDINATOR_MAX_IN_FLIGHT_PER_KEY": pool,
                **self._coordinator_env,
            },
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        log.close()
        self.cluster.start()
        deadline = time.monotonic() + 60
        while True:
            try:
                if all(
                    httpx.get(f"http://127.0.0.1:{port}/health", timeout=2, verify=client_tls()).status_code == 200
                    for port in (self.port, self.management_port)
                ):
                    return
            except httpx.TransportError:
                pass
            if self.coordinator.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Coordinator did not start; see {self.log_path}")
            time.sleep(0.1)  # polling with a deadline

    async def publish(self) -> None:
        body = {"instance_id": INSTANCE, "model": MODEL, "generation": 0, "endpoints": self._endpoints(self.published)}
        answer = await self.manage.post(COORDINATOR_SET_PATH, json=body)
        answer.raise_for_status()

    def _endpoints(self, ranks: list[int]) -> list[dict[str, Any]]:
        return [{"id": r, "ip": "127.0.0.1", "port": self.cluster.ports[r]} for r in ranks]

    def coordinator_rss_mib(self) -> float:
        assert self.coordinator is not None
        return (rss_kib(self.coordinator.pid) or 0) / 1024

    def coordinator_alive(self) -> bool:
        return self.coordinator is not None and self.coordinator.poll() is None

    async def coordinator_status(self) -> dict[str, Any]:
        """Outcomes and requests in progress, read from /metrics (the Coordinator's status surface over HTTP)."""
        text = (await self.scrape.get("/metrics")).text
        outcomes: Counter[str] = Counter()
        status: dict[str, Any] = {"outcomes": outcomes}
        for line in text.splitlines():
            if line.startswith("heteroflow_coordinator_requests_total{"):
                labels, value = line.rsplit(" ", 1)
                outcome = labels.split('outcome="', 1)[1].split('"', 1)[0]
                outcomes[outcome] += int(float(value))
            elif line.startswith("heteroflow_coordinator_requests_in_progress"):
                name, value = line.split(" ", 1)
                status[name.removeprefix("heteroflow_coordinator_requests_")] = int(float(value))
        return status

    async def scale_down(self, rank: int, *, while_withdrawn: Callable[[], Awaitable[None]] | None = None) -> Round:
        """Kill ``rank`` (its whole session: API server and worker), then run the round as the controller does.

        ``while_withdrawn`` runs after the DEL returned and before the apply: the moment requests pile up in the
        Coordinator's unavailable wait.
        """
        round_ = Round(rank=rank)
        survivors = [r for r in self.published if r != rank]
        round_.killed = time.time()
        os.killpg(self.cluster.processes[rank].pid, signal.SIGKILL)

        async def survivors_unhealthy() -> bool:
            entries = [await conformance.status_of(self.cluster, r) for r in survivors]
            return all(entry is not None and entry["status"] == "unhealthy" for entry in entries)

        await self.cluster.eventually(survivors_unhealthy, within=60, what="survivors unhealthy after the kill")
        round_.detected = round_.del_sent = time.time()
        withdraw = {"instance_id": INSTANCE, "endpoint_ids": self.published, "request_id": f"load-{rank}"}
        (await self.manage.post(COORDINATOR_DEL_PATH, json=withdraw)).raise_for_status()
        round_.del_acked = time.time()
        if while_withdrawn is not None:
            await while_withdrawn()
        store_port = free_port()
        for r in survivors:
            body = {
                "instruction": "scale_down",
                "request_id": f"load-{rank}",
                "params": {"removed_dp_ranks": [rank], "dp_master_ip": "127.0.0.1", "dp_store_port": store_port},
            }
            answer = await conformance.apply(self.cluster, r, body)
            if answer.status_code != 202:
                raise RuntimeError(f"apply on rank {r}: HTTP {answer.status_code} {answer.text}")
        round_.applied = time.time()
        await conformance.wait_status(self.cluster, survivors, "healthy", within=60)
        round_.healthy = round_.add_sent = time.time()
        publish = {"instance_id": INSTANCE, "model": MODEL, "generation": 1, "endpoints": self._endpoints(survivors)}
        (await self.manage.post(COORDINATOR_ADD_PATH, json=publish)).raise_for_status()
        round_.add_acked = time.time()
        self.published = survivors
        return round_

    def failed_attempts(self) -> list[Attempt]:
        """Every ``coordinator.upstream_failed`` line of the Coordinator's log."""
        attempts = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if '"coordinator.upstream_failed"' not in line:
                continue
            entry = json.loads(line)
            attempts.append(
                Attempt(
                    at=datetime.fromisoformat(entry["timestamp"].replace("Z", "+00:00")).timestamp(),
                    request_id=entry["request_id"],
                    endpoint=f"{entry['instance']}/{entry['endpoint']}",
                    reason=entry.get("reason", ""),
                    will_retry=bool(entry.get("will_retry")),
                )
            )
        return attempts

    async def aclose(self) -> None:
        await self.manage.aclose()
        await self.scrape.aclose()
        await self.cluster.aclose_clients()

    def close(self) -> None:
        if self.coordinator is not None and self.coordinator.poll() is None:
            self.coordinator.kill()
            self.coordinator.wait(15)
        self.cluster.close()


@contextlib.asynccontextmanager
async def running(workdir: Path, **kwargs: Any) -> AsyncIterator[Stack]:
    stack = Stack(workdir, **kwargs)
    try:
        await asyncio.to_thread(stack.start)
        await stack.publish()
        yield stack
    finally:
        await stack.aclose()
        stack.close()


class Load:
    """Streaming chat completions through the Coordinator, as many in flight as asked, each recorded."""

    def __init__(self, url: str, *, concurrency: int, max_tokens: int, timeout_sec: float = 120.0) -> None:
        self.records: list[Record] = []
        self.max_tokens = max_tokens
        self._timeout_s = timeout_sec
        self._counter = 0
        self._clients = [
            httpx.AsyncClient(
                base_url=url,
                headers={"Authorization": f"Bearer {TEST_API_KEY}"},
                timeout=httpx.Timeout(timeout_sec, connect=10.0),
                limits=httpx.Limits(max_connections=POOL_SIZE, max_keepalive_connections=POOL_SIZE),
                verify=client_tls(),
            )
            for _ in range(-(-concurrency // POOL_SIZE))
        ]

    async def aclose(self) -> None:
        for client in self._clients:
            await client.aclose()

    async def one(self, lane: int, *, tag: str = "r") -> Record:
        """One streaming request over lane ``lane``, read to its end."""
        self._counter += 1
        record = Record(request_id=f"{tag}-{self._counter}", started=time.time())
        self.records.append(record)
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"load {self._counter % 7}"}],
            "max_tokens": self.max_tokens,
            "stream": True,
        }
        client = self._clients[lane % len(self._clients)]
        try:
            async with asyncio.timeout(self._timeout_s):
                async with client.stream(
                    "POST", "/v1/chat/completions", json=body, headers={"X-Request-Id": record.request_id}
                ) as answer:
                    record.first_byte = time.time()
                    record.status = answer.status_code
                    record.endpoint = answer.headers.get("x-heteroflow-endpoint")
                    record.retry_after = answer.headers.get("retry-after")
                    if answer.status_code != 200:
                        await answer.aread()
                        record.outcome = f"http_{answer.status_code}"
                        record.error = answer.text[:300]
                    else:
                        record.outcome = await _read_events(answer, record)
        except TimeoutError:
            record.outcome = "transport:timeout"
        except httpx.HTTPError as exc:
            record.outcome = f"transport:{type(exc).__name__}"
        record.ended = time.time()
        return record

    async def keep(self, concurrency: int, stop: asyncio.Event, *, tag: str = "r") -> None:
        """``concurrency`` requests in flight until ``stop`` is set: each lane sends its next one at once."""

        async def lane(index: int) -> None:
            while not stop.is_set():
                record = await self.one(index, tag=tag)
                if record.status == 503 and (record.retry_after or "").isdigit():
                    # as an OpenAI client retries a 503: after the Retry-After (or sooner if the run ends)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), min(int(record.retry_after or 0), 5))

        await asyncio.gather(*(lane(i) for i in range(concurrency)))

    async def burst(self, count: int, *, tag: str) -> list[Record]:
        """``count`` requests at once."""
        return list(await asyncio.gather(*(self.one(i, tag=tag) for i in range(count))))


async def _read_events(answer: httpx.Response, record: Record) -> str:
    error = False
    async for line in answer.aiter_lines():
        if not line.startswith("data: "):
            continue
        data = line.removeprefix("data: ")
        if data == "[DONE]":
            return "error_event" if error else "done"
        record.events += 1
        if '"error"' in data and "error" in json.loads(data):
            error = True
    return "error_event" if error else "cut"


@dataclass
class Verdict:
    """What a run shows about routing around the withdrawal."""

    routed_after_withdrawal: list[str] = field(default_factory=list)
    """Requests sent to a withdrawn endpoint after the DEL returned (must be empty)."""
    on_dying_rank: Counter[str] = field(default_factory=Counter)
    """Outcomes of the requests the dying rank was serving or was tried for."""
    retried_off_dying_rank: int = 0


def judge(records: list[Record], attempts: list[Attempt], round_: Round) -> Verdict:
    """Compare every request's endpoints with the round's DEL and ADD. Purely computational.

    A request started after the DEL returned may reach the instance only after the ADD was sent (every endpoint
    was withdrawn between the two), and never the dead rank. Its endpoints: the one that answered (header) and
    every failed attempt in the log.
    """
    verdict = Verdict()
    dead = endpoint_label(round_.rank)
    failed: dict[str, list[Attempt]] = {}
    for attempt in attempts:
        failed.setdefault(attempt.request_id, []).append(attempt)
    for record in records:
        tried = failed.get(record.request_id, [])
        if record.started > round_.del_acked:
            if record.endpoint == dead or any(a.endpoint == dead for a in tried):
                verdict.routed_after_withdrawal.append(f"{record.request_id}: reached the dead rank {dead}")
            if record.endpoint is not None and (record.first_byte or 0) < round_.add_sent:
                verdict.routed_after_withdrawal.append(
                    f"{record.request_id}: answered by {record.endpoint} before the ADD was sent"
                )
            for attempt in tried:
                if attempt.at < round_.add_sent:
                    verdict.routed_after_withdrawal.append(
                        f"{record.request_id}: tried {attempt.endpoint} between the DEL and the ADD"
                    )
        if record.endpoint == dead or any(a.endpoint == dead for a in tried):
            verdict.on_dying_rank[record.outcome] += 1
            verdict.retried_off_dying_rank += any(a.endpoint == dead and a.will_retry for a in tried)
    return verdict


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def sample_rss(stack: Stack, samples: list[float], stop: asyncio.Event, *, period_sec: float = 0.5) -> None:
    """The Coordinator's RSS every ``period_sec`` until ``stop``."""
    while not stop.is_set():
        samples.append(stack.coordinator_rss_mib())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), period_sec)


def clean(outcome: str) -> bool:
    """A request the client got a clear answer to: a complete stream, a stream ended by an error event, or an
    error answer from the Coordinator (never a cut stream, a dropped connection or a timeout)."""
    return outcome in ("done", "error_event") or (outcome.startswith("http_") and outcome != "http_500")
