"""Which environment variables are HeteroFlow settings, so that no test inherits one from the shell that runs it.

A settings group (:class:`~heteroflow.core.settings.LenientSettings`) reads each field from the
``HETEROFLOW_``-prefixed name and the design's own names (``GPU_HEALTH_RETENTION_DAYS``, ``GPU_FAULT_PREDICT_RATIO``,
``ALERT_BACKLOG_HOURS``, …), matched case-insensitively (never from the bare field name: ``DATABASE_URL`` in a
shell is no setting). Two rules together cover all of them:

- :data:`PREFIXES` and :data:`NAMES`: every upper-case name the groups read, declared here so that a reader sees
  what is cleared (``tests/unit/test_environment_isolation.py`` fails when a group reads a name they miss);
- every name any loaded settings group reads (:func:`settings_env_names`), whatever its case.
  :func:`load_settings_modules` imports every module that defines a group, so names only a subprocess reads are
  cleared too (a subprocess inherits the cleaned environment).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Iterator
from pathlib import Path

from pydantic import AliasChoices

from heteroflow.core.settings import LenientSettings

PREFIXES = ("HETEROFLOW_", "GPU_HEALTH_", "GPU_METRICS_", "GPU_MEMORY_HIGH_", "GPU_WEAK_", "GPU_FAULT_")
NAMES = frozenset({"ALERT_BACKLOG_HOURS"})

_PACKAGE = Path(__file__).resolve().parents[2] / "src" / "heteroflow"


def load_settings_modules() -> list[str]:
    """Import every ``heteroflow`` module that defines a settings group; returns their names."""
    names = []
    for path in sorted(_PACKAGE.rglob("*.py")):
        if "(LenientSettings)" in path.read_text(encoding="utf-8"):
            relative = path.relative_to(_PACKAGE.parent).with_suffix("")
            names.append(".".join(relative.parts[:-1] if relative.name == "__init__" else relative.parts))
    for name in names:
        importlib.import_module(name)
    return names


def settings_groups() -> list[type[LenientSettings]]:
    """Every settings group imported so far."""

    def walk(cls: type[LenientSettings]) -> Iterator[type[LenientSettings]]:
        for sub in cls.__subclasses__():
            yield sub
            yield from walk(sub)

    return sorted(set(walk(LenientSettings)), key=lambda cls: (cls.__module__, cls.__qualname__))


def env_names_of(group: type[LenientSettings]) -> set[str]:
    """The environment names ``group`` reads, as written in the code."""
    names: set[str] = set()
    for field_name, field in group.model_fields.items():
        alias = field.validation_alias
        if isinstance(alias, AliasChoices):
            names.update(choice for choice in alias.choices if isinstance(choice, str))
        elif isinstance(alias, str):
            names.add(alias)
        else:
            names.add(f"{group.model_config.get('env_prefix', '')}{field_name}")
    return names


def settings_env_names(groups: Iterable[type[LenientSettings]] | None = None) -> frozenset[str]:
    """Every name the groups read, upper-cased (the environment is matched case-insensitively)."""
    return frozenset(name.upper() for group in groups or settings_groups() for name in env_names_of(group))


def is_declared(name: str) -> bool:
    """Whether ``name`` is covered by :data:`PREFIXES` or :data:`NAMES`."""
    upper = name.upper()
    return upper.startswith(PREFIXES) or upper in NAMES


def settings_in(environ: Iterable[str], known: frozenset[str]) -> list[str]:
    """The names of ``environ`` that are HeteroFlow settings: declared, or read by a group in ``known``."""
    return [name for name in environ if is_declared(name) or name.upper() in known]
