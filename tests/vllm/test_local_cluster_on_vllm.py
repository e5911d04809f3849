"""The local cluster on two real vLLM ranks (``heteroflow up --engine vllm``): a killed rank leads to a
restored, serving instance with no manual step.

Released vLLM cannot scale down: the gate refuses with ENGINE_SCALE_DOWN_UNSUPPORTED (shown in the
controller's status with the discovered capability), the frozen fallback restarts both real ranks, and the
instance serves completions through the Coordinator again. Figures go to ``$VLLM_TIER_FIGURES``.

All along, two official ``openai`` clients (``max_retries=0``; one streaming) send one completion after the
other through the Coordinator, from before the kill until the restarted ranks serve them. Each ends with real
text or a clear error (503 with ``Retry-After``; a stream cut after output: an error event saying it could not
be resumed) — never an aborted answer reported as success — and no error comes later than the Coordinator's
bound (the client deadline plus the faulted first-byte bound, docs/coordinator.md); a request held until the
restored ranks were published is answered by them within one completion's time after that bound.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import yaml

from heteroflow.http.tls import client_tls
from heteroflow.local.client import ClusterClient, ClusterUnreachableError
from heteroflow.local.cluster import ClusterOptions, LocalCluster
from heteroflow.serving.coordinator.settings import CoordinatorSettings
from heteroflow.serving.node_manager.supervisor import descendants_of
from tests.support.openai_load import Tally, Timed, lanes

pytestmark = pytest.mark.vllm

T = TypeVar("T")

SLACK_SEC = 5.0
"""What the Coordinator's bound may take beyond its settings on two loaded cores (its event loop, the reply)."""
ANSWER_SEC = 30.0
"""One completion on a rank just restarted on two loaded cores (2-14 s measured): a request held until the
restored ranks were published may still take this long after the hold."""
CLIENT_TIMEOUT_SEC = 120.0
"""The openai clients' own timeout: far past every bound, so that the Coordinator, not the client, ends a wait."""


def until(check: Callable[[], T | None], *, within: float, what: str) -> T:
    deadline = time.monotonic() + within
    while True:
        try:
            found = check()
        except (ClusterUnreachableError, httpx.HTTPError):
            found = None
        if found:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {within} s: {what}")
        time.sleep(0.5)


def worker_of(api_pid: int) -> int:
    for pid in sorted(descendants_of(api_pid)):
        try:
            if Path(f"/proc/{pid}/comm").read_text().startswith("VLLM::Worker"):
                return pid
        except OSError:
            continue
    raise AssertionError(f"no VLLM::Worker under API server {api_pid}")


def client_bound_sec() -> float:
    """How long the Coordinator may keep a request whose engines are faulted: held and re-routed until the client
    deadline, an attempt on an endpoint reported faulted cut after the faulted first-byte bound (the same
    settings the cluster's Coordinator reads from this environment)."""
    settings = CoordinatorSettings.load()
    return settings.client_deadline_sec + settings.faulted_first_byte_sec + SLACK_SEC


def clear_error(request: Timed) -> bool:
    """503 with Retry-After, or a stream cut after output whose error event says so (it could not be resumed:
    no engine answered within the client deadline)."""
    if request.outcome == "error:http_503":
        return request.detail.startswith("[Retry-After: ")
    return request.outcome == "error:APIError" and request.detail.startswith("the engine failed while streaming")


def client_figures(requests: list[Timed], *, killed_sec: float, serving_sec: float) -> dict[str, float]:
    """The clients' view of the fault, for the figures (times since the lanes started)."""
    during = [r for r in requests if r.started_sec + r.latency_sec >= killed_sec and r.started_sec <= serving_sec]
    ok = [r.latency_sec for r in requests if r.outcome == "ok"]
    refused = [r.latency_sec for r in requests if r.outcome == "error:http_503"]
    errors = [r.latency_sec for r in requests if r.outcome != "ok"]
    return {
        "client_requests": len(requests),
        "client_ok": len(ok),
        "client_503": len(refused),
        "client_other_errors": len(requests) - len(ok) - len(refused),
        "client_ok_p50_sec": statistics.median(ok),
        "client_503_min_sec": min(refused, default=0.0),
        "client_503_max_sec": max(refused, default=0.0),
        "client_error_max_sec": max(errors, default=0.0),
        "client_ok_max_sec": max(ok),
        "client_max_during_fault_sec": max(r.latency_sec for r in during),
    }


def coordinator_retries(coordinator_url: str, cluster_token: str) -> dict[str, float]:
    """``heteroflow_coordinator_retries_total`` by reason: the fault answers the Coordinator kept from the clients."""
    answer = httpx.get(
        f"{coordinator_url}/metrics",
        headers={"Authorization": f"Bearer {cluster_token}"},
        timeout=10,
        verify=client_tls(),
    )
    answer.raise_for_status()
    found: dict[str, float] = {}
    for line in answer.text.splitlines():
        if line.startswith('heteroflow_coordinator_retries_total{reason="'):
            labels, value = line.rsplit(" ", 1)
            found[labels.split('"')[1]] = float(value)
    return found


@pytest.mark.timeout(1200)
def test_a_killed_real_rank_is_restored_by_the_whole_instance_fallback(
    vllm_python: Path, tiny_model: Path, tmp_path: Path
) -> None:
    config = tmp_path / "operator.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "fault_tolerance_config": {
                    "nudge_idle_survivors": True,  # an idle released survivor sees the fault only under traffic
                    "serving_view_refresh_sec": 2.0,
                    "dp_scale_down_config": {"poll_interval_sec": 0.5},
                }
            }
        )
    )
    options = ClusterOptions(
        data_dir=tmp_path / "local",
        server_port=0,
        controller_port=0,
        coordinator_port=0,
        controller_config=config,
        dp_size=2,
        pods=2,
        sim_nodes=1,
        engine="vllm",
        vllm_model=tiny_model,
        collective_timeout_sec=15.0,
    )
    cluster = LocalCluster(options)
    clients: list[ClusterClient] = []
    tally, stop = Tally(), threading.Event()  # the openai clients' outcomes; set: they stop after their request
    bound_sec = client_bound_sec()
    started = time.monotonic()
    state = cluster.start()
    try:
        cluster.wait_ready(timeout_sec=600)
        ready_sec = time.monotonic() - started
        client = cluster.client(timeout_sec=90)
        clients.append(client)

        def served() -> bool:
            """One completion through the Coordinator that really generated (an abort is HTTP 200 too)."""
            answer = httpx.post(
                f"{state.coordinator_url}/v1/completions",
                json={"model": state.instances[0].model, "prompt": "hello world", "max_tokens": 4},
                headers={"Authorization": f"Bearer {state.api_key or state.admin_token}"},
                timeout=90,
                verify=client_tls(),
            )
            return answer.status_code == 200 and answer.json()["choices"][0]["finish_reason"] in {"length", "stop"}

        assert served()
        # two official openai clients from here to the end: one plain, one streaming
        lanes_began = time.monotonic()
        threads = lanes(
            state, tally, stop, threads=2, max_tokens=8, timeout_sec=CLIENT_TIMEOUT_SEC, extra_body={"ignore_eos": True}
        )

        def oks() -> int:
            return sum(1 for r in tally.snapshot() if r.outcome == "ok")

        until(lambda: oks() >= 4, within=120, what="the openai clients are served before the fault")
        entry = client.instance_status("inst-1")
        assert entry is not None
        assert entry["engine_capability"] == {
            "protocol_profile": "vllm-0.32",
            "scale_down_supported": False,
            "retry_supported": True,
            "elastic_ep_supported": False,
        }
        pods = {p.pod_id: p for p in state.instance("inst-1").pods}
        victim_pod = pods["inst-1-pod-b"]
        nm_status: dict[str, Any] = client.node_manager_status(victim_pod.node_manager_url)
        api_pid = next(e["pid"] for e in nm_status["endpoints"] if e["endpoint_id"] == 1)
        first_incarnations = {
            pod_id: [e["incarnation"] for e in client.node_manager_status(p.node_manager_url)["endpoints"]]
            for pod_id, p in pods.items()
        }

        killed_at = time.monotonic()
        os.kill(worker_of(api_pid), signal.SIGKILL)

        def refused() -> dict[str, Any] | None:
            found = client.instance_status("inst-1")
            return found if found and "ENGINE_SCALE_DOWN_UNSUPPORTED" in found["gate"]["reason_codes"] else None

        refusal = until(refused, within=180, what="the gate refuses scale-down on released vLLM")
        refused_sec = time.monotonic() - killed_at
        assert refusal["gate"]["allowed"] is False

        def restarted() -> bool:
            for pod_id, pod in pods.items():
                endpoints = client.node_manager_status(pod.node_manager_url)["endpoints"]
                if [e["incarnation"] for e in endpoints] == first_incarnations[pod_id]:
                    return False
                if not all(e["ready"] for e in endpoints):
                    return False
            return True

        until(restarted, within=600, what="both real ranks restarted by the fallback and ready")

        until(served, within=300, what="the instance serves through the Coordinator again")
        serving_sec = time.monotonic() - killed_at
        served_again = oks()
        until(lambda: oks() >= served_again + 2, within=120, what="the openai clients are served again")
        stop.set()
        for thread in threads:
            thread.join(timeout=CLIENT_TIMEOUT_SEC)
        assert not any(t.is_alive() for t in threads), "an openai client still waits for its answer"
        requests = tally.snapshot()
        killed_sec = killed_at - lanes_began
        sent_during = [r for r in requests if killed_sec <= r.started_sec <= killed_sec + serving_sec]
        assert sent_during, "no client request was sent while the instance was being restored"
        for request in requests:
            if request.outcome == "ok":  # held at most until the bound, then answered by a restored rank
                assert request.latency_sec <= bound_sec + ANSWER_SEC, f"served past the bound: {request}"
            else:
                assert clear_error(request), f"neither text nor a clear error: {request}"
                assert request.latency_sec <= bound_sec, f"past the Coordinator's bound of {bound_sec:g} s: {request}"
        seen = client_figures(requests, killed_sec=killed_sec, serving_sec=killed_sec + serving_sec)
        retries = coordinator_retries(state.coordinator_url, state.cluster_token or "")
        final = client.instance_status("inst-1")
        assert final is not None
        assert final["can_serve"]
        assert sorted(final["published_endpoints"]) == [0, 1]
        out = os.environ.get("VLLM_TIER_FIGURES")
        if out:
            with Path(out).open("a", encoding="utf-8") as fh:
                figures = {"ready_sec": ready_sec, "kill_to_gate_refused_sec": refused_sec, **seen}
                fh.write(
                    json.dumps(
                        {
                            "tier": "vllm-local-cluster",
                            **figures,
                            "kill_to_serving_sec": serving_sec,
                            "coordinator_retries": retries,
                        }
                    )
                )
                fh.write("\n")
    finally:
        stop.set()
        for opened in clients:
            opened.close()
        report = cluster.stop()
        assert not report.left, report.left
