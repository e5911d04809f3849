"""``heteroflow`` — the single command surface of the platform.

Each command's module is imported only when that command runs (or when help lists it): a controller, NodeManager,
Coordinator or engine-sim process does not pay for the platform server's FastAPI and SQLAlchemy, the agent's
collectors or the admin commands' database layer — about two seconds of start-up per process otherwise.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping
from typing import Annotated, Any, Final

import typer
from typer._click import Context  # the click that typer vendors and runs (not the click package)
from typer.core import TyperGroup

from heteroflow.cli.errors import DEBUG_ENV, FAILED_EXIT_CODE, debug_requested, one_line
from heteroflow.core.logs import configure_logging

_DEBUG_KEY: Final = "heteroflow.debug"

COMMANDS: Final[dict[str, tuple[str, str]]] = {
    "admin": ("heteroflow.cli.admin", "app"),
    "db": ("heteroflow.cli.admin", "db_app"),
    "agent": ("heteroflow.cli.agent", "app"),
    "health": ("heteroflow.cli.health", "app"),
    "sim": ("heteroflow.cli.sim", "app"),
    "up": ("heteroflow.cli.local", "up"),
    "engine-sim": ("heteroflow.cli.engine_sim", "engine_sim"),
    "node-manager": ("heteroflow.cli.node_manager", "node_manager"),
    "coordinator": ("heteroflow.cli.coordinator", "coordinator"),
    "controller": ("heteroflow.cli.controller", "controller"),
    "fault": ("heteroflow.cli.fault", "app"),
    "status": ("heteroflow.cli.fault", "status"),
    "restore": ("heteroflow.cli.fault", "restore"),
    "server": ("heteroflow.cli.server", "server"),
}
"""Command name → (module, attribute), in help order: a ``typer.Typer`` is a command group, a function one command."""


def load_command(name: str) -> Any:
    """The click command ``name`` stands for, its module imported now."""
    module, attribute = COMMANDS[name]
    target = getattr(importlib.import_module(module), attribute)
    if isinstance(target, typer.Typer):
        command: Any = typer.main.get_group(target)
    else:
        single = typer.Typer(add_completion=False)
        single.command(name)(target)
        command = typer.main.get_command(single)
    command.name = name
    return command


class LazyCommandMap(MutableMapping[str, Any]):
    """A group's commands: every name of :data:`COMMANDS`, each loaded the first time it is looked up."""

    def __init__(self) -> None:
        self._loaded: dict[str, Any] = {}
        self._names = list(COMMANDS)

    def __getitem__(self, name: str) -> Any:
        if name not in self._loaded:
            if name not in self._names:
                raise KeyError(name)
            self._loaded[name] = load_command(name)
        return self._loaded[name]

    def __setitem__(self, name: str, command: Any) -> None:
        if name not in self._names:
            self._names.append(name)
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        self._names.remove(name)
        self._loaded.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._names))

    def __len__(self) -> int:
        return len(self._names)


class LazyCommands(TyperGroup):
    """The top-level group, its commands a :class:`LazyCommandMap`; a failure the operator can fix is one line."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands = LazyCommandMap()

    def invoke(self, ctx: Context) -> Any:
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort):
            raise
        except Exception as exc:
            line = one_line(exc)
            if line is None or debug_requested(bool(ctx.meta.get(_DEBUG_KEY))):
                raise
            typer.echo(f"error: {line}", err=True)
            raise typer.Exit(FAILED_EXIT_CODE) from exc


app = typer.Typer(
    name="heteroflow",
    help="HeteroFlow keeps large GPU/NPU inference fleets serving through hardware faults.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    cls=LazyCommands,
)


@app.callback()
def _quiet_logs_on_stderr(
    ctx: typer.Context,
    debug: Annotated[
        bool, typer.Option("--debug", help=f"Show the traceback of a failure instead of one line [env {DEBUG_ENV}=1]")
    ] = False,
) -> None:
    """HeteroFlow keeps large GPU/NPU inference fleets serving through hardware faults."""
    ctx.meta[_DEBUG_KEY] = debug
    # commands print their results on stdout; logs go to stderr, warnings and above unless a command says otherwise
    configure_logging(level="warning", json=False)


if __name__ == "__main__":  # pragma: no cover
    app()
