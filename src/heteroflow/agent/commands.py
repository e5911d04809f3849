"""Running vendor tools: the :class:`CommandRunner` seam and its subprocess implementation.

Every collector that reads a vendor tool goes through this seam, so tests swap the tool for a fake
(``heteroflow.agent.testing.FakeCommandRunner``) or put a fake executable on ``PATH``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol


class CommandError(Exception):
    """Base of the errors running a vendor tool."""


class ToolMissingError(CommandError):
    """The tool is not installed (not on ``PATH``): a warning, never an error of the agent."""


class ToolTimeoutError(CommandError):
    """The tool did not finish within the tick's time limit and was killed."""


@dataclass(frozen=True, slots=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str


class CommandRunner(Protocol):
    def which(self, tool: str) -> str | None:
        """The path the tool would run from, or ``None`` when it is not installed."""
        ...

    def run(self, argv: Sequence[str], *, timeout_sec: float) -> CommandResult:
        """Run a tool to completion. Raises :class:`ToolMissingError` or :class:`ToolTimeoutError`."""
        ...


class SubprocessRunner:
    """Runs tools as child processes, looking them up on ``PATH`` (or the ``env`` given)."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self._env = dict(env) if env is not None else None

    def which(self, tool: str) -> str | None:
        path = (self._env or os.environ).get("PATH")
        return shutil.which(tool, path=path)

    def run(self, argv: Sequence[str], *, timeout_sec: float) -> CommandResult:
        executable = self.which(argv[0])
        if executable is None:
            raise ToolMissingError(f"{argv[0]} is not installed (not found on PATH)")
        try:
            done = subprocess.run(  # noqa: S603 - a fixed vendor tool with fixed arguments, no shell
                [executable, *argv[1:]],
                capture_output=True,
                text=True,
                errors="replace",
                timeout=timeout_sec,
                env=self._env,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise ToolTimeoutError(f"{argv[0]} did not answer within {timeout_sec:g} s") from exc
        except OSError as exc:
            raise ToolMissingError(f"{argv[0]} could not be started: {exc}") from exc
        return CommandResult(returncode=done.returncode, stdout=done.stdout, stderr=done.stderr)
