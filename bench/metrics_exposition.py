"""The per-GPU series of the server's ``/metrics``: written out, against ``prometheus_client``'s own path.

A fleet's cards make most of a scrape: ``--nodes`` nodes (default 3,000) x 8 cards, each with five health
counters and five telemetry values, are 240,000 lines at 3,000 nodes. Times, as the best of ``--rounds`` (CPU
time of this process), the server's :func:`~heteroflow.platform_server.metrics.gpu_exposition` and the same
families through the library's metric families and ``generate_latest`` (the reference the unit tests hold the
server's text equal to, byte for byte), and prints the ratio. Usage::

    .venv/bin/python bench/metrics_exposition.py [--nodes 3000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the reference lives with the tests
from tests.unit.platform_server.test_gpu_exposition import LatestCard, library_exposition

from heteroflow.health.counters import Counters
from heteroflow.health.gpu_metrics import GpuMetrics
from heteroflow.platform_server.metrics import gpu_exposition


def fleet(nodes: int) -> list[LatestCard]:
    """A fleet's newest values as the server keeps them: simulated-looking counters and telemetry per card."""
    return [
        LatestCard(
            node_name=f"load-{node:05d}",
            gpu_index=gpu,
            uuid=f"GPU-{node:08x}-{gpu:04x}-5e59-b77b-94d81dd87904",
            counters=Counters(0, (node * 8 + gpu) % 13, 0, gpu % 2, 0),
            metrics=GpuMetrics(
                35.0 + (node + gpu) % 40,
                float((node * gpu) % 101),
                float(node * 7 % 81559),
                81559.0,
                70.0 + (node * 31 + gpu) % 63000 / 100,
            ),
        )
        for node in range(nodes)
        for gpu in range(8)
    ]


def best(render: Callable[[Sequence[LatestCard]], bytes], cards: list[LatestCard], rounds: int) -> tuple[float, bytes]:
    times, text = [], b""
    for _ in range(rounds):
        started = time.process_time()
        text = render(cards)
        times.append(time.process_time() - started)
    return min(times), text


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--nodes", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    cards = fleet(args.nodes)
    ours, text = best(gpu_exposition, cards, args.rounds)
    library, reference = best(library_exposition, cards, args.rounds)
    if text != reference:
        raise SystemExit("the written-out series differ from the library's")
    lines = text.count(b"\n")
    print(
        f"{len(cards):,} cards, {lines:,} lines, {len(text) / 1e6:.1f} MB; best of {args.rounds}, "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print(f"prometheus_client generate_latest: {library * 1000:7.0f} ms")
    print(f"gpu_exposition (the server's):     {ours * 1000:7.0f} ms   x{ours / library:.3f} of the library's")


if __name__ == "__main__":
    main()
