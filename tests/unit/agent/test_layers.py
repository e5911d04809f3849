"""The agent's pure core imports no HTTP client and no NVML; only their shell modules do."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import heteroflow.agent

AGENT = Path(heteroflow.agent.__file__).parent
FOREIGN = {"httpx", "pynvml", "fastapi", "starlette", "sqlalchemy", "uvicorn"}
ALLOWED = {"client.py": {"httpx"}}  # nvml.py loads pynvml through importlib, only when asked to


def imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("module", sorted(p.name for p in AGENT.glob("*.py")))
def test_only_the_shell_imports_foreign_systems(module: str) -> None:
    foreign = imported_roots(AGENT / module) & FOREIGN
    assert foreign <= ALLOWED.get(module, set())


def test_pynvml_is_only_named_by_the_nvml_module() -> None:
    naming = {p.name for p in AGENT.glob("*.py") if '"pynvml"' in p.read_text()}
    assert naming == {"nvml.py"}
