"""The local cluster on two real vLLM ranks (``heteroflow up --engine vllm``): a killed rank leads to a
restored, serving instance with no manual step.

Released vLLM cannot scale down: the gate refuses with ENGINE_SCALE_DOWN_UNSUPPORTED (shown in the
controller's status with the discovered capability), the frozen fallback restarts both real ranks, and the
instance serves completions through the Coordinator again. Figures go to ``$VLLM_TIER_FIGURES``.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import yaml

from heteroflow.local.client import ClusterClient, ClusterUnreachableError
from heteroflow.local.cluster import ClusterOptions, LocalCluster
from heteroflow.serving.node_manager.supervisor import descendants_of

pytestmark = pytest.mark.vllm

T = TypeVar("T")


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
            )
            return answer.status_code == 200 and answer.json()["choices"][0]["finish_reason"] in {"length", "stop"}

        assert served()
        entry = client.instance_status("inst-1")
        assert entry is not None
        assert entry["engine_capability"] == {
            "protocol_profile": "vllm-released",
            "scale_down_supported": False,
            "retry_supported": True,
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
        final = client.instance_status("inst-1")
        assert final is not None
        assert final["can_serve"]
        assert sorted(final["published_endpoints"]) == [0, 1]
        out = os.environ.get("VLLM_TIER_FIGURES")
        if out:
            with Path(out).open("a", encoding="utf-8") as fh:
                figures = {"ready_sec": ready_sec, "kill_to_gate_refused_sec": refused_sec}
                fh.write(json.dumps({"tier": "vllm-local-cluster", **figures, "kill_to_serving_sec": serving_sec}))
                fh.write("\n")
    finally:
        for opened in clients:
            opened.close()
        report = cluster.stop()
        assert not report.left, report.left
