"""The controller core imports no I/O (STYLE practice 1; the import-linter contract proposed in
docs/controller-core.md says the same): only the stdlib's pure modules, pydantic models of the wire contract
and its own modules."""

from __future__ import annotations

import ast
from pathlib import Path

import heteroflow.serving.controller.core as core

ALLOWED_ROOTS = {"__future__", "collections", "dataclasses", "enum", "re", "types", "typing", "heteroflow"}
ALLOWED_HETEROFLOW = ("heteroflow.contracts.serving", "heteroflow.core.")


def imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def test_the_core_imports_nothing_with_side_effects() -> None:
    modules = sorted(Path(core.__file__).parent.glob("*.py"))
    assert len(modules) >= 9
    for path in modules:
        for module in imported_modules(path):
            assert module.split(".")[0] in ALLOWED_ROOTS, f"{path.name} imports {module}"
            if module.startswith("heteroflow"):
                assert module.startswith(ALLOWED_HETEROFLOW), f"{path.name} imports {module}"
