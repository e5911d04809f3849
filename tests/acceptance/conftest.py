"""Fixtures of the acceptance suite: where evidence goes, and one running local cluster per configuration.

A cluster takes ~20-30 s to start on two shared cores, so each test module shares one (module scope) and walks
its rows in order; every row starts by waiting for the state it needs, so a failed row fails the next ones with
a clear message instead of a confusing one.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

EVIDENCE_ENV = "HETEROFLOW_EVIDENCE_DIR"
_EVIDENCE_DIR = os.environ.get(EVIDENCE_ENV)
"""Read at import: the autouse fixture of ``tests/conftest.py`` removes every ``HETEROFLOW_*`` variable before
each test, so the value has to be taken before any test runs."""

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without torch (the ``sim`` extra) no simulated engine can start: every row is skipped, visibly."""
    if importlib.util.find_spec("torch") is not None:
        return
    skip = pytest.mark.skip(
        reason="the acceptance suite needs torch for the simulated engines (pip install -e '.[sim]')"
    )
    for item in items:
        if _HERE in item.path.parents:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def evidence_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if _EVIDENCE_DIR:
        root = Path(_EVIDENCE_DIR).resolve()
        root.mkdir(parents=True, exist_ok=True)
        return root
    return tmp_path_factory.mktemp("evidence")
