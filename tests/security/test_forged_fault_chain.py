"""The chained attack on the local cluster's serving plane (real processes: platform, controller, Coordinator,
NodeManagers with simulated engines, simulated agents).

It was: starve a node's beats until it is offline, re-register its hostname with the agent token alone to get a
new credential, report XID 79 on the node's real card, and the controller retired the rank. Now the agent token
alone gets no new credential however long the node is silent; and when an operator's release lets that token claim
one, an XID reported under it is held for an operator: the rank is not retired, the instance keeps serving on every
rank, and the controller's GPU-health source says why.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from heteroflow.http.tls import client_tls
from heteroflow.local import ClusterOptions, LocalCluster
from heteroflow.local.client import ClusterClient, ClusterUnreachableError
from heteroflow.local.hardware import card_of
from heteroflow.platform.nodes import NODE_CREDENTIAL_HEADER
from tests.security.services import auth
from tests.support.polling import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def test_a_claimed_credential_cannot_retire_a_rank_with_a_forged_xid(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    options = ClusterOptions(data_dir=tmp_path / "local", server_port=0, controller_port=0, coordinator_port=0)
    cluster = LocalCluster(options)
    state = cluster.start()
    try:
        cluster.wait_ready(timeout_sec=180)
        assert state.agent_token
        http = httpx.Client(timeout=30, verify=client_tls(), trust_env=False)
        with ClusterClient(state, timeout_sec=30) as client, http:
            inst = state.instances[0]
            target = card_of(inst, 3)
            node = next(n for n in client.platform_nodes() if n["name"] == target.node and n["source"] == "simulated")
            registration = {
                "hostname": target.node,
                "vendor": node["vendor"],
                "model": node["model"],
                "gpu_count": node["gpu_count"],
                "source": "simulated",
            }
            register = f"{state.server_url}/api/v1/nodes/register"
            # the agent token alone never takes the node over, however long it is silent
            refused = http.post(register, json=registration, headers=auth(state.agent_token))
            assert (refused.status_code, refused.json()["error"]) == (409, "node_credential_required")
            # an operator releases the node (an agent lost its disk); the token's holder claims it first
            released = http.post(
                f"{state.server_url}/api/v1/nodes/{node['id']}/release", headers=auth(state.admin_token)
            )
            assert released.status_code == 200, released.text
            claimed = http.post(register, json=registration, headers=auth(state.agent_token))
            assert claimed.status_code == 200, claimed.text
            credential = claimed.json()["node_credential"]
            event = {
                "index": target.index,
                "uuid": target.uuid,
                "xid": 79,
                "occurred_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            beat = http.post(
                f"{state.server_url}/api/v1/nodes/{node['id']}/heartbeat",
                json={"xid_events": [event]},
                headers={**auth(state.agent_token), NODE_CREDENTIAL_HEADER: credential},
            )
            assert beat.status_code == 200, beat.text
            assert beat.json()["xid_events"]["stored"] == 1

            def held() -> str | None:
                monitor: dict[str, Any] = http.get(
                    f"{state.controller_url}/controller/resource_monitor", headers=auth(state.cluster_token or "")
                ).json()
                problems = [str(s.get("last_problem") or "") for s in monitor.get("sources", [])]
                return next((p for p in problems if "held for an operator" in p), None)

            said = until(held, within=60, what="the controller's source holding the forged XID")
            assert target.node in said
            # a few more polls and the correlation window: nothing is retired, every rank still serves
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                entry = client.instance_status(inst.instance_id) or {}
                assert entry.get("dead_committed", []) == [], entry
                assert entry.get("hardware_faults", []) == [], entry
                time.sleep(0.5)  # the polling period of this check, bounded by the deadline above
            assert client.published(inst.instance_id) == [0, 1, 2, 3]
            try:
                assert client.completion("still served on every rank")
            except ClusterUnreachableError as exc:  # pragma: no cover - reported as the failure it is
                raise AssertionError(f"the instance stopped serving: {exc}") from exc
    finally:
        report = cluster.stop()
    assert report.left == ()
