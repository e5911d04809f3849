"""An elastic EP resize done outside HeteroFlow, on real simulator processes: no scale-down until a relaunch.

The real controller and two real NodeManagers (``enable_elastic_ep``) launch four ``heteroflow engine-sim`` ranks
(pod ``a``: ranks 0-1, pod ``b``: 2-3; 4 logical experts + 4 redundant, so a shrink to 3 keeps every expert).
An operator shrinks the world to 3 through vLLM's own ``/scale_elastic_ep``, sent to every old rank at once:
rank 3 is retired by vLLM's rules, and the operator then stops it. The NodeManagers mark the resized ranks and the
controller's status shows it; the next real fault (rank 1's worker killed) reaches a scale-down round whose gate
refuses it (``ELASTIC_EP_RESIZED``): the instance goes through the whole-instance relaunch, serves on every rank
again in a fresh world of 4, and the mark is gone. (``docs/node-manager.md`` and ``docs/controller.md``, An elastic
EP resize done outside HeteroFlow.) Nothing sleeps for synchronisation: every wait polls with a deadline.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from heteroflow.http.tls import client_tls
from heteroflow.serving.node_manager.testing import TEST_CLUSTER_TOKEN
from tests.integration.serving.controller_harness import Plane, SimPorts, run_plane

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

AUTH = {"Authorization": f"Bearer {TEST_CLUSTER_TOKEN}"}
PROMPT = {"prompt": "hi", "max_tokens": 2}


def resized(status: dict[str, Any]) -> dict[int, tuple[bool, int | None]]:
    """Each rank's elastic EP mark as the controller's status shows it: (resized, DP size asked)."""
    return {
        r["rank"]: (r["elastic_ep_resized"], r["elastic_ep_requested_dp_size"])
        for pod in status.get("pods", [])
        for r in pod["ranks"]
    }


def test_a_resize_outside_heteroflow_sends_the_next_fault_to_a_relaunch(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    ports = SimPorts.free()

    async def scenario(plane: Plane) -> None:
        async with httpx.AsyncClient(headers=AUTH, timeout=60.0, verify=client_tls()) as engines:
            before = await plane.status()
            assert before["gate"]["allowed"] is True
            assert set(resized(before).values()) == {(False, None)}
            launched = {r: (await engines.get(ports.url(r) + "/sim/info")).json()["api_pid"] for r in range(4)}

            # -- the operator's shrink to 3, sent to every old rank at once (vLLM's rule) ----------------------
            answers = await asyncio.gather(
                *(
                    engines.post(ports.url(r) + "/scale_elastic_ep", json={"new_data_parallel_size": 3})
                    for r in range(4)
                )
            )
            assert [a.status_code for a in answers] == [200] * 4, [a.text for a in answers]
            retired = await engines.post(ports.url(3) + "/v1/completions", json=PROMPT)
            assert retired.status_code == 503
            assert "retired" in retired.json()["error"]
            info = (await engines.get(ports.url(0) + "/sim/info")).json()
            assert (info["dp_size"], info["ft_dp_size"]) == (3, 4)  # the FT keeps the launch's size

            # -- the NodeManagers mark the resized ranks; the controller's status and gate show it ------------
            marked = await plane.until(
                lambda s: all(resized(s)[r] == (True, 3) for r in (0, 1, 2)),
                within=15,
                what="ranks 0-2 marked resized by elastic EP",
            )
            assert marked["gate"]["allowed"] is True  # a mark alone starts nothing: the gate is a round's
            # vLLM's gate answered the FT status route with 503 while the resize ran, and answers the retired rank's
            # for good: a pause, neither a fault nor a protocol error, so no report and no round
            assert marked["rounds"] == []
            assert "protocol_error" not in marked["engine_statuses"].values(), marked["engine_statuses"]
            own = {e.endpoint_id: e for nm in plane.node_managers.values() for e in nm.status().endpoints}
            assert all(own[r].elastic_ep_resized and own[r].elastic_ep_requested_dp_size == 3 for r in (0, 1, 2))

            # -- the operator stops the retired rank (it awaits shutdown); then a real fault: rank 1's worker dies
            os.killpg(plane.node_managers["b"].supervisor.pids()[3], signal.SIGKILL)
            injected = await engines.post(ports.url(1) + "/sim/faults", json={"kind": "kill_worker"})
            assert injected.status_code == 202, injected.text
            await asyncio.gather(
                *(engines.post(ports.url(r) + "/v1/completions", json=PROMPT) for r in (0, 2)), return_exceptions=True
            )
            with_round = await plane.until(lambda s: bool(s["rounds"]), within=30, what="a round for the fault")
            timeline = await plane.round(with_round["rounds"][-1])
            (decided,) = [e for e in timeline["events"] if e["kind"] == "decided"]
            assert (decided["candidates"], decided["survivors"]) == ([1, 3], [0, 2])
            assert decided["fallback"] == "InstanceReconfiguration"  # the frozen fallback: a whole-instance relaunch
            (gate,) = [e for e in timeline["events"] if e["kind"] == "gate"]
            assert gate["allowed"] is False
            assert gate["reason_codes"] == ["ELASTIC_EP_RESIZED"]
            assert "(DP size asked: 3)" in gate["warnings"][0]
            (failed,) = [e for e in timeline["events"] if e["kind"] == "failed"]
            assert failed["error"] == "gate refused: ELASTIC_EP_RESIZED"
            assert not [e for e in timeline["events"] if e["kind"] in ("dispatch", "apply")]  # nothing scaled down

            # -- the whole-instance path: every rank relaunched, serving, the mark gone ------------------------
            back = await plane.until(
                lambda s: (
                    s["can_serve"]
                    and s["published_endpoints"] == [0, 1, 2, 3]
                    and s["dead_committed"] == []
                    and set(resized(s).values()) == {(False, None)}
                ),
                within=60,
                what="the relaunched instance serving on every rank without the mark",
            )
            assert back["phase"] == "NORMAL"
            assert back["fallback_strategy"] == "InstanceReconfiguration"
            for r in range(4):
                info = (await engines.get(ports.url(r) + "/sim/info")).json()
                assert info["api_pid"] != launched[r]
                assert (info["dp_rank"], info["dp_size"]) == (r, 4)
                done = await engines.post(ports.url(r) + "/v1/completions", json=PROMPT)
                assert done.status_code == 200, done.text

    run_plane(
        scenario,
        tmp_path,
        virtual_time=False,
        sim_processes=ports,
        ready_within=120,
        # the operator's stop of rank 3 and rank 1's fault are one round's evidence, however loaded the machine
        ft={"software_fault_collection_timeout_sec": 15.0},
        spec_extra={
            "enable_elastic_ep": True,
            "cpu_distributed_timeout_sec": 3,
            "engine_recovery_timeout_sec": 60,
            "sim": {"python": sys.executable, "exit_linger_sec": 3, "rebuild_timeout_sec": 15},
        },
    )
