"""The request-body checks on a hostile megabyte: the byte scan against the parse-and-walk it replaced.

    python bench/body_checks.py [--repeat 5]

Prints, per body, the best of ``--repeat`` runs of each method and their ratio (baseline: ``json.loads`` and
the iterative Python depth walk, which ran on the event loop for every request before the token check).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable

from heteroflow.core.request_body import exceeds_depth, nesting_depth, text_problem

BODIES: dict[str, bytes] = {
    "349,000 empty arrays": b"[" + b",".join([b"[]"] * 349_000) + b"]",
    "60,000 objects with bracket strings": b"[" + b",".join([b'[{"a": "[[[["}]'] * 60_000) + b"]",
    "one 1 MB string": b'{"a": "' + b"x" * 1_000_000 + b'"}',
}


def best(run: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()}")
    print("| body | bytes | parse + walk ms | byte scan ms | x faster |")
    print("|---|---|---|---|---|")
    for name, raw in BODIES.items():

        def parse_and_walk(raw: bytes = raw) -> object:
            return nesting_depth(json.loads(raw))

        def byte_scan(raw: bytes = raw) -> object:
            return exceeds_depth(raw), text_problem(raw)

        baseline = best(parse_and_walk, args.repeat)
        scan = best(byte_scan, args.repeat)
        print(f"| {name} | {len(raw):,} | {baseline * 1000:.1f} | {scan * 1000:.1f} | {baseline / scan:.0f} |")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
