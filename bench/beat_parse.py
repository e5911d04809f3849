"""The per-card parse of one heartbeat (``health/beat_stats.beat_readings``) timed alone, on the agent's own body.

It times it on one node's body of 8 cards (``bench/ingest.py``'s ``agent_nodes``, fresh sample times, the server's
default sample time window), twice: the general path (the stats as wire objects, as the route reads a body with an
odd value) and the typed one (the stats as ``WIRE_BEAT`` decodes the common agent's body, the route's usual path);
and says whether the module it timed was compiled, so that a build of the module (mypyc, an extension) can be
compared with the source on the same machine, alternating. The baselines of the same run are the body's decodes
that come before each: pydantic's one-step decode and validation (``Heartbeat.model_validate_json``) and the typed
one (``WIRE_BEAT.decode``)::

    .venv/bin/python bench/beat_parse.py [--number 3000] [--repeat 7]
    PYTHONPATH=<a tree with a compiled beat_stats>/src .venv/bin/python bench/beat_parse.py
"""

from __future__ import annotations

import argparse
import sys
import timeit
from collections.abc import Callable
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
    wired = beat_stats.WIRE_BEAT.decode(body)
    window = HealthStorageSettings.load().sample_time_window()
    received_at = datetime.now(UTC)

    def parse() -> None:
        beat_stats.beat_readings(
            beat.gpu_stats, node_id=NodeId("bench"), source="simulated", received_at=received_at, window=window
        )

    def parse_typed() -> None:
        beat_stats.beat_readings(
            wired.gpu_stats, node_id=NodeId("bench"), source="simulated", received_at=received_at, window=window
        )

    def decode() -> None:
        Heartbeat.model_validate_json(body)

    def decode_typed() -> None:
        beat_stats.WIRE_BEAT.decode(body)

    def best(function: Callable[[], None]) -> float:
        number: int = args.number
        return min(timeit.repeat(function, number=number, repeat=args.repeat)) / number

    built = "compiled" if not str(beat_stats.__file__).endswith(".py") else "source"
    print(f"beat_readings, {len(beat.gpu_stats)} cards; {built}: {beat_stats.__file__}")
    for name, parsed, decoded, decoder in (
        ("general", parse, decode, "pydantic's one-step"),
        ("typed", parse_typed, decode_typed, "the typed"),
    ):
        parse_time, decode_time = best(parsed), best(decoded)
        print(
            f"  {name:<8} {parse_time * 1e6:6.2f} us per beat, x{parse_time / decode_time:.2f} of {decoder} decode "
            f"and validation of the same body ({decode_time * 1e6:.2f} us)"
        )


if __name__ == "__main__":
    main()
