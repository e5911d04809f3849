"""The server's collector policy, run in a process of its own (it changes the interpreter's collector)."""

from __future__ import annotations

import gc
import json
import subprocess
import sys

from heteroflow.core.collector import watch_pauses

_PROBE = """
import gc, json, sys
from heteroflow.core.collector import settle_after_start_up
class Node:
    def __init__(self):
        self.me = self  # a reference cycle: only the collector frees it
before = gc.get_threshold()
settle_after_start_up(young_threshold=int(sys.argv[1]))
frozen = gc.get_freeze_count()
# cyclic garbage made after start-up is still collected
import weakref
probe = Node()
alive = weakref.ref(probe)
del probe
gc.collect()
print(json.dumps({"before": before, "after": gc.get_threshold(), "frozen": frozen, "cycle_freed": alive() is None}))
"""


def _run(young_threshold: int) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(young_threshold)], capture_output=True, text=True, check=True, timeout=60
    )
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_start_up_objects_are_frozen_and_young_collections_come_less_often() -> None:
    result = _run(50_000)
    before, after = result["before"], result["after"]
    assert isinstance(before, list)
    assert isinstance(after, list)
    assert after == [50_000, before[1], before[2]]
    assert isinstance(result["frozen"], int)
    assert result["frozen"] > 1_000
    assert result["cycle_freed"] is True


def test_zero_leaves_the_collector_as_it_is() -> None:
    result = _run(0)
    assert result["after"] == result["before"]
    assert result["frozen"] == 0
    assert result["cycle_freed"] is True


def test_every_collection_is_recorded_with_its_pause_until_the_watch_stops() -> None:
    seen: list[tuple[int, float]] = []
    stop = watch_pauses(lambda generation, seconds: seen.append((generation, seconds)))
    try:
        gc.collect()
    finally:
        stop()
    assert (2, seen[-1][1]) == seen[-1]
    assert seen[-1][1] >= 0.0
    count = len(seen)
    gc.collect()
    assert len(seen) == count
