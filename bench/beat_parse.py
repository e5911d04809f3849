"""The per-card parse of one heartbeat (``health/beat_stats.beat_readings``) timed alone, on the agent's own body.

A quarter of the heartbeat route's time in process (``bench/heartbeat_cpu.py --stages``). This times it on one
node's body of 8 cards (``bench/ingest.py``'s ``agent_nodes``, fresh sample times, the server's default sample
time window) and says whether the module it timed was compiled, so that a build of the module (mypyc, an
extension) can be compared with the source on the same machine, alternating. The baseline of the same run is the
body's one-step decode and validation (``Heartbeat.model_validate_json``), which the parse follows on the route::

    .venv/bin/python bench/beat_parse.py [--number 3000] [--repeat 7]
    PYTHONPATH=<a tree with a compiled beat_stats>/src .venv/bin/python bench/beat_parse.py
"""

from __future__ import annotations

import argparse
import sys
import timeit
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: bench.ingest
from bench.ingest import agent_nodes
from heteroflow.contracts.heartbeat import Heartbeat
from heteroflow.core.ids import NodeId
from heteroflow.health import beat_stats
from heteroflow.health.settings import HealthStorageSettings


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--number", type=int, default=3000, help="parses per timing")
    parser.add_argument("--repeat", type=int, default=7, help="timings; the fastest is printed")
    args = parser.parse_args()
    body = agent_nodes(1)[0].body(None)
    beat = Heartbeat.model_validate_json(body)
    window = HealthStorageSettings.load().sample_time_window()
    received_at = datetime.now(UTC)

    def parse() -> None:
        beat_stats.beat_readings(
            beat.gpu_stats, node_id=NodeId("bench"), source="simulated", received_at=received_at, window=window
        )

    def decode() -> None:
        Heartbeat.model_validate_json(body)

    best = min(timeit.repeat(parse, number=args.number, repeat=args.repeat)) / args.number
    floor = min(timeit.repeat(decode, number=args.number, repeat=args.repeat)) / args.number
    built = "compiled" if not str(beat_stats.__file__).endswith(".py") else "source"
    print(
        f"beat_readings, {len(beat.gpu_stats)} cards: {best * 1e6:.2f} us per beat, x{best / floor:.2f} of decoding "
        f"and validating the same body ({floor * 1e6:.2f} us); {built}: {beat_stats.__file__}"
    )


if __name__ == "__main__":
    main()
