from __future__ import annotations

import itertools

from heteroflow.agent.simulated import PROFILES, SimulatedCollector, simulated_counters
from heteroflow.core.testing import FakeClock
from heteroflow.health.counters import Counters


def test_profiles_move_as_named(clock: FakeClock) -> None:
    sim = SimulatedCollector(clock=clock, count=5, seed="n1", speed=3600.0)  # one simulated hour per second
    start = {g.index: g.counters for g in sim.read_health().gpus}
    assert all(c == Counters(0, 0, 0, 0, 0) for c in start.values())
    clock.advance(4)
    later = {g.index: g.counters for g in sim.read_health().gpus}
    assert later[0] == Counters(0, 0, 0, 0, 0)  # healthy
    assert later[1].ecc_corrected_total is not None
    assert later[1].ecc_corrected_total > 0
    assert later[2].ecc_uncorrected_total == 1  # sudden UE
    assert later[3].remapped_rows_pending == 1
    assert later[4].remapped_rows_failure == 1


def test_same_seed_same_uuids_and_vendor(clock: FakeClock) -> None:
    a = SimulatedCollector(clock=clock, count=2, seed="n1").read_health()
    b = SimulatedCollector(clock=clock, count=2, seed="n1").read_health()
    assert [g.uuid for g in a.gpus] == [g.uuid for g in b.gpus]
    assert all(g.vendor == "simulated" for g in a.gpus)
    assert a.collector == "simulated"


def test_degrading_is_accelerating() -> None:
    day = [simulated_counters("degrading", 24.0 * d).ecc_corrected_total or 0 for d in range(4)]
    deltas = [b - a for a, b in itertools.pairwise(day)]
    assert deltas == sorted(deltas)
    assert deltas[0] < deltas[-1]
    assert set(PROFILES) == {"healthy", "degrading", "sudden_ue", "remap_pending", "remap_failure"}
