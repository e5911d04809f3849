"""``heteroflow coordinator``: registered on the command surface, usage errors before anything starts; the
management listener's thread priority."""

from __future__ import annotations

import os
import threading

from typer.testing import CliRunner

from heteroflow.cli.coordinator import raise_thread_priority
from heteroflow.cli.main import app


def test_help_names_the_options_and_their_variables() -> None:
    result = CliRunner().invoke(app, ["coordinator", "--help"], env={"COLUMNS": "240"})
    assert result.exit_code == 0
    for text in ("--host", "--port", "--platform-url", "HETEROFLOW_COORDINATOR_PORT", "HETEROFLOW_CLUSTER_TOKEN"):
        assert text in result.output


def test_a_port_out_of_range_is_a_usage_error() -> None:
    result = CliRunner().invoke(app, ["coordinator", "--port", "70000"])
    assert result.exit_code == 2


def run_in_thread(nice: int) -> tuple[bool, int, int]:
    """``raise_thread_priority(nice)`` on a new thread: its answer, then that thread's nice and the main thread's
    (Linux keeps a nice value per thread; the main thread's id is the process id)."""
    seen: list[tuple[bool, int, int]] = []

    def body() -> None:
        changed = raise_thread_priority(nice)
        seen.append(
            (
                changed,
                os.getpriority(os.PRIO_PROCESS, threading.get_native_id()),
                os.getpriority(os.PRIO_PROCESS, os.getpid()),
            )
        )

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    return seen[0]


def test_the_management_thread_gets_its_priority_or_says_it_could_not() -> None:
    before = os.getpriority(os.PRIO_PROCESS, os.getpid())
    changed, thread_nice, process_nice = run_in_thread(before - 5)
    # only the thread moves; with CAP_SYS_NICE (root) it is 5 steps ahead, without it nothing changed
    assert thread_nice == (before - 5 if changed else before)
    assert process_nice == before
    if os.geteuid() == 0:
        assert changed


def test_a_lower_priority_needs_no_privilege() -> None:
    before = os.getpriority(os.PRIO_PROCESS, os.getpid())
    changed, thread_nice, _ = run_in_thread(min(19, before + 3))
    assert changed
    assert thread_nice == min(19, before + 3)
