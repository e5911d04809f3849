from __future__ import annotations

import warnings
from types import ModuleType

import pytest


@pytest.fixture(scope="session")
def torch() -> ModuleType:
    """torch, or a skip when the optional ``sim`` extra is not installed."""
    with warnings.catch_warnings():
        # the CPU wheel warns at import that NumPy is absent; the simulator does not use NumPy
        warnings.simplefilter("ignore")
        module: ModuleType = pytest.importorskip("torch")
        return module
