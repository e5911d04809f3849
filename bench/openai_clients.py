"""The official ``openai`` client through the Coordinator while ranks die: what a client sees of a fault.

A local cluster (real processes: controller, Coordinator, NodeManagers, simulated engines with torch workers;
``heteroflow.local.LocalCluster``) serves one DP-4 instance (``--instances 2``: two instances behind the same
model). ``--threads`` client threads (default 6, half of them streaming) each send one request after the
other with ``openai.OpenAI(max_retries=0)`` — no client-side retry, so every failure the Coordinator lets
through is counted. The faults, one after the other, each waited for until the controller has published the
survivors:

- ``kill`` (default): rank 2's worker is killed, then rank 0's (the DP store host);
- ``hang``: rank 2's worker is SIGSTOPped (its peers meet it only at the collective timeout), then rank 0's
  worker is killed.

Counted per request: ``ok`` (an answer with text, or a stream ending with a ``finish_reason`` other than
``abort``), ``abort`` (a ``finish_reason: "abort"`` answer), ``error:<type>`` (the client raised: an HTTP error
status or a transport error, or an error event ended a stream), ``empty`` (an answer without text). Usage::

    .venv/bin/python bench/openai_clients.py [--threads 6] [--scenario kill|hang] [--instances 1]
                                             [--settle 5] [--max-tokens 16] [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import openai
import yaml

from heteroflow.local import ClusterOptions, ClusterState, LocalCluster
from heteroflow.local.client import ClusterClient, ClusterUnreachableError
from heteroflow.local.faults import KillMode, hang, kill

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the shared load lives with the tests

from tests.support.openai_load import Tally, lanes
from tests.support.polling import until


def published(state: ClusterState, instance_id: str) -> list[int] | None:
    """The survivors the Coordinator serves once a round committed (``None`` while a round runs)."""
    with ClusterClient(state, timeout_sec=5) as client, contextlib.suppress(ClusterUnreachableError):
        entry = client.instance_status(instance_id)
        if entry is not None and entry.get("can_serve") and not entry.get("running_strategy"):
            alive = list(entry.get("alive_dp_ranks") or [])
            return alive if list(entry.get("published_endpoints") or []) == alive else None
    return None


def fault(state: ClusterState, rank: int, *, how: str) -> str:
    inst = state.instances[0]
    with ClusterClient(state, timeout_sec=5) as client:
        if how == "hang":
            return hang(client, inst, rank)
        return kill(client, inst, rank, mode=KillMode.WORKER)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--threads", type=int, default=6)
    parser.add_argument("--scenario", choices=("kill", "hang"), default="kill")
    parser.add_argument("--instances", type=int, default=1)
    parser.add_argument("--settle", type=float, default=5.0, help="seconds of traffic before, between and after")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--data-dir", type=Path, default=None)
    args = parser.parse_args()
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="hf-openai-"))
    config = data_dir / "controller.yaml"
    data_dir.mkdir(parents=True, exist_ok=True)
    config.write_text(yaml.safe_dump({"fault_tolerance_config": {"enable_dp_scale_down": True}}))
    options = ClusterOptions(
        data_dir=data_dir / "cluster",
        server_port=0,
        controller_port=0,
        coordinator_port=0,
        controller_config=config,
        instances=args.instances,
        sim_nodes=0,
    )
    tally, stop = Tally(), threading.Event()
    marks: list[str] = []
    with LocalCluster(options) as cluster:
        cluster.start()
        cluster.wait_ready(timeout_sec=300)
        state = cluster.state
        instance_id = state.instances[0].instance_id
        began = time.monotonic()
        threads = lanes(state, tally, stop, threads=args.threads, max_tokens=args.max_tokens)
        try:
            time.sleep(args.settle)  # traffic before the first fault (a measured phase, not a synchronisation)
            first = "hang" if args.scenario == "hang" else "kill"
            for rank, how, left in ((2, first, [0, 1, 3]), (0, "kill", [1, 3])):
                at = time.monotonic() - began
                marks.append(f"{at:.1f}s {fault(state, rank, how=how)}")

                def left_published(left: list[int] = left) -> bool:
                    return published(state, instance_id) == left

                try:
                    until(left_published, within=180, what=f"{left} published")
                except TimeoutError as exc:  # still report what the clients saw
                    marks.append(f"{time.monotonic() - began:.1f}s {exc}")
                    break
                marks.append(f"{time.monotonic() - began:.1f}s published {left}")
                time.sleep(args.settle)
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=180)
    total = sum(tally.outcomes.values())
    failed = total - tally.outcomes["ok"]
    print(
        f"openai {openai.__version__} client, max_retries 0, {args.threads} threads (half streaming), scenario "
        f"{args.scenario}, {args.instances} instance(s), {os.cpu_count()} CPUs; load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    for mark in marks:
        print(f"  {mark}")
    print(f"requests {total}: ok {tally.outcomes['ok']}, failed {failed} {dict(tally.outcomes)}")
    for at, outcome, detail in tally.failures[:20]:
        print(f"  {at:7.2f}s {outcome}: {detail}")
    sys.exit(0 if failed == 0 else 1)


if __name__ == "__main__":
    main()
