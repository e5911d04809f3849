"""Every listening service binds loopback unless told otherwise (``serving-ft.md``: nothing listens beyond the
configured address), checked on every settings class and every command of the CLI, found by reading them.

That a real process started without host options listens on loopback only is in ``test_processes.py``.
"""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer.main
from pydantic_settings import BaseSettings

import heteroflow
from heteroflow.agent.settings import AgentSettings
from heteroflow.cli.main import app as cli
from heteroflow.core.settings import LenientSettings
from heteroflow.engine_sim.settings import EngineSimSettings
from heteroflow.platform_server.settings import ServerSettings
from heteroflow.serving.controller.config import ControllerSettings
from heteroflow.serving.coordinator.settings import CoordinatorSettings
from heteroflow.serving.node_manager.settings import NodeManagerSettings

LOOPBACK = frozenset({"127.0.0.1", "::1"})
BIND_FIELD = re.compile(r"(^|_)(host|bind|listen)(_|$)")
"""Names of settings fields and CLI options that choose where a socket listens."""

SETTINGS_OF_COMMAND: dict[str, type[BaseSettings]] = {
    "server": ServerSettings,
    "controller": ControllerSettings,
    "node-manager": NodeManagerSettings,
    "coordinator": CoordinatorSettings,
    "engine-sim": EngineSimSettings,
}
"""The settings class whose default a command's unset ``--host`` falls back to."""

SERVER_LIBRARIES = ("uvicorn", "fastapi", "starlette", "http.server", "socketserver", "aiohttp")
SRC = Path(heteroflow.__file__).resolve().parent


def _module_name(path: Path) -> str:
    return ".".join(("heteroflow", *path.relative_to(SRC).with_suffix("").parts)).removesuffix(".__init__")


def settings_classes() -> list[type[BaseSettings]]:
    """Every settings class defined under ``src/heteroflow``: modules that define a class deriving from a
    ``…Settings`` class are imported, then every ``BaseSettings`` subclass they define is collected."""
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any(ast.unparse(b).endswith("Settings") for b in node.bases):
                importlib.import_module(_module_name(path))
                break

    def below(cls: type[BaseSettings]) -> Iterator[type[BaseSettings]]:
        for sub in cls.__subclasses__():
            yield sub
            yield from below(sub)

    return sorted({c for c in below(BaseSettings) if c.__module__.startswith("heteroflow.")}, key=lambda c: c.__name__)


def bind_fields(cls: type[BaseSettings]) -> dict[str, Any]:
    return {
        name: field.get_default(call_default_factory=True)
        for name, field in cls.model_fields.items()
        if BIND_FIELD.search(name)
    }


def test_every_settings_class_binds_loopback_by_default() -> None:
    classes = settings_classes()
    listening = {cls for cls in classes if bind_fields(cls)}
    assert set(SETTINGS_OF_COMMAND.values()) <= listening, "a service's settings lost their bind address"
    for cls in listening:
        for name, default in bind_fields(cls).items():
            assert default in LOOPBACK, f"{cls.__module__}.{cls.__name__}.{name} defaults to {default!r}"
            assert issubclass(cls, LenientSettings)  # what every service's settings derive from (load())
            assert cls.load().model_dump()[name] in LOOPBACK, f"{cls.__name__}.{name} loads as non-loopback"


def test_the_agent_listens_nowhere() -> None:
    assert not bind_fields(AgentSettings), "the agent grew a bind address: check its default and add it above"
    for path in sorted((SRC / "agent").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        servers = sorted(m for m in imported if m.split(".")[0] in SERVER_LIBRARIES or m in SERVER_LIBRARIES)
        assert not servers, f"{path.relative_to(SRC)} imports a server library: {servers}"


def commands() -> Iterator[tuple[str, Any]]:
    def walk(command: Any, prefix: tuple[str, ...]) -> Iterator[tuple[str, Any]]:
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                yield from walk(sub, (*prefix, name))
        else:
            yield " ".join(prefix), command

    yield from walk(typer.main.get_command(cli), ())


def test_no_command_defaults_to_a_non_loopback_address() -> None:
    found = dict(commands())
    assert set(SETTINGS_OF_COMMAND) <= set(found), "a service command disappeared from the CLI"
    for name, command in found.items():
        for option in command.params:
            if not BIND_FIELD.search(option.name or ""):
                continue
            assert name in SETTINGS_OF_COMMAND, f"'heteroflow {name}' has a bind option; map it to its settings"
            assert option.default is None or option.default in LOOPBACK, f"heteroflow {name} --{option.name}"
            if option.default is None:  # unset: the settings decide, and the help says what they decide
                assert "127.0.0.1" in (option.help or ""), f"heteroflow {name} --{option.name}: help hides the default"
                assert bind_fields(SETTINGS_OF_COMMAND[name])[option.name] in LOOPBACK
