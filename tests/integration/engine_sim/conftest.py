from __future__ import annotations

import warnings

import pytest


@pytest.fixture(autouse=True, scope="session")
def _needs_torch() -> None:
    """The real simulator needs the optional ``sim`` extra (torch); skip cleanly without it."""
    with warnings.catch_warnings():
        # the CPU wheel warns at import that NumPy is absent; the simulator does not use NumPy
        warnings.simplefilter("ignore")
        pytest.importorskip("torch")
