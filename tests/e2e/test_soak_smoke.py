"""A short soak (``bench/soak.py``): one local cluster (DP 4 over 2 pods, simulated engines with torch workers)
under client traffic and random faults with a fixed seed, for about a minute of faults. Every kind of fault —
a rank killed, a worker hung, a transient collective failure, a hardware fault — is injected at least once, and
no invariant of the soak is violated: committed ranks stay out, nothing is routed to a withdrawn endpoint, every
round ends committed or fallen back, the platform database stays within its write rules, no process leaks.
"""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path

import pytest
from bench.soak import KINDS, SoakOptions, run_soak
from bench.soak_report import summary

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(420),
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the simulated engines need torch (sim)"),
]


def test_a_minute_of_random_faults_breaks_no_invariant(tmp_path: Path) -> None:
    options = SoakOptions(
        duration_sec=45,
        seed=7,
        instances=1,
        baseline_sec=10,
        clients=4,
        gap_sec=(1.0, 3.0),
        spare_store_master=True,  # a hung store host stalls the instance unnoticed: the bench lists it, 30 s each
        data_dir=tmp_path,
    )
    report = run_soak(options)
    print(summary(report))  # shown by pytest when the test fails
    injected = Counter(f.kind for f in report.faults if f.error is None)
    assert set(injected) == set(KINDS), f"not every kind of fault was injected: {dict(injected)}"
    assert report.violations == []
    assert report.requests["ok"] > 0
    assert report.processes["left_after_stop"] == []
