"""The ProcessSupervisor over real processes: a worker stopped with a real SIGSTOP is a death, and is killed;
a killed API server is reported with its exit code even when its subprocesses are seen gone first."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from heteroflow.serving.node_manager.spec import EngineCommand
from heteroflow.serving.node_manager.supervisor import (
    PopenLauncher,
    ProcessSupervisor,
    pid_exiting,
    pid_gone,
    pid_stopped,
)
from heteroflow.serving.node_manager.testing import FakeLauncher, FakeProcess
from tests.support.polling import until

# an "API server" that starts one worker subprocess and waits for it, as the simulator's rank does
_ENGINE = (
    "import subprocess, sys, time\n"
    "worker = subprocess.Popen([sys.executable, '-c', 'import time\\nwhile True: time.sleep(0.05)'])\n"
    "worker.wait()\n"
)


def _supervised(tmp_path: Path, *, stopped_dead_sec: float) -> tuple[ProcessSupervisor, int]:
    supervisor = ProcessSupervisor(PopenLauncher(log_dir=tmp_path), stopped_dead_sec=stopped_dead_sec)
    command = EngineCommand(endpoint_id=2, argv=(sys.executable, "-c", _ENGINE), env=(), url="http://127.0.0.1:1")
    supervisor.launch(command)
    api_pid = supervisor.pids()[2]
    inc = supervisor._engines[2]
    until(lambda: inc.handle.descendants(), within=30, what="the worker subprocess started")
    supervisor.mark_ready(2)
    (worker,) = inc.adopted
    assert api_pid != worker
    return supervisor, worker


def test_a_sigstopped_worker_is_reported_dead_after_the_limit_and_killed(tmp_path: Path) -> None:
    supervisor, worker = _supervised(tmp_path, stopped_dead_sec=3.0)
    api_pid = supervisor.pids()[2]
    try:
        assert supervisor.check(now=0.0) == []
        os.kill(worker, signal.SIGSTOP)
        until(lambda: pid_stopped(worker), within=10, what="the worker stopped")
        assert supervisor.check(now=10.0) == []  # first seen stopped
        assert supervisor.check(now=12.9) == []
        os.kill(worker, signal.SIGCONT)  # resumed in time: the count starts over
        until(lambda: not pid_stopped(worker), within=10, what="the worker resumed")
        assert supervisor.check(now=13.0) == []
        os.kill(worker, signal.SIGSTOP)
        until(lambda: pid_stopped(worker), within=10, what="the worker stopped again")
        assert supervisor.check(now=14.0) == []
        assert supervisor.check(now=16.9) == []
        (death,) = supervisor.check(now=17.0)
        assert death.endpoint_id == 2
        assert f"[{worker}]" in death.detail
        assert "stopped for 3 s" in death.detail
        assert not supervisor.running(2)
        # the whole session was SIGKILLed: the stopped worker and its API server are gone
        until(lambda: pid_gone(worker), within=10, what="the stopped worker killed")
        until(lambda: supervisor._engines[2].handle.exit_code() is not None, within=10, what="API server gone")
        assert supervisor._engines[2].handle.exit_code() == -signal.SIGKILL
        assert supervisor.check(now=30.0) == []  # reported once
    finally:
        supervisor.stop_all(grace_sec=0)
    assert pid_gone(api_pid)


def test_a_stopped_api_server_alone_is_no_death(tmp_path: Path) -> None:
    supervisor, worker = _supervised(tmp_path, stopped_dead_sec=3.0)
    api_pid = supervisor.pids()[2]
    try:
        os.kill(api_pid, signal.SIGSTOP)
        until(lambda: pid_stopped(api_pid), within=10, what="the API server stopped")
        assert supervisor.check(now=0.0) == []
        assert supervisor.check(now=60.0) == []
        assert supervisor.running(2)
        assert not pid_gone(worker)
        os.kill(api_pid, signal.SIGCONT)
    finally:
        supervisor.stop_all(grace_sec=0)


def test_a_stopped_engine_session_is_a_stall_not_a_death(tmp_path: Path) -> None:
    supervisor, worker = _supervised(tmp_path, stopped_dead_sec=3.0)
    api_pid = supervisor.pids()[2]
    try:
        os.killpg(api_pid, signal.SIGSTOP)  # API server and worker, as a frozen pod
        until(lambda: pid_stopped(api_pid) and pid_stopped(worker), within=10, what="the session stopped")
        assert supervisor.check(now=0.0) == []
        assert supervisor.check(now=60.0) == []
        os.killpg(api_pid, signal.SIGCONT)
        until(lambda: not pid_stopped(api_pid) and not pid_stopped(worker), within=10, what="the session resumed")
        assert supervisor.check(now=61.0) == []
        assert supervisor.running(2)
        os.kill(worker, signal.SIGSTOP)  # then the worker alone: the count starts from its own stop
        until(lambda: pid_stopped(worker), within=10, what="the worker stopped")
        assert supervisor.check(now=62.0) == []
        (death,) = supervisor.check(now=65.0)
        assert death.endpoint_id == 2
    finally:
        supervisor.stop_all(grace_sec=0)


def test_an_exiting_process_is_told_from_a_running_one() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        until(lambda: pid_gone(child.pid), within=30, what="the child exited (a zombie nobody reaped yet)")
        assert pid_exiting(child.pid)
        assert not pid_exiting(os.getpid())
    finally:
        child.wait()
    assert not pid_exiting(child.pid)  # reaped: no such process


def _worker_gone_while_the_api_server_exits() -> tuple[ProcessSupervisor, FakeProcess]:
    """A fake engine whose worker is gone while its API server is still in the kernel's exit path."""
    launcher = FakeLauncher()
    supervisor = ProcessSupervisor(launcher)
    supervisor.launch(EngineCommand(endpoint_id=3, argv=("engine",), env=(), url="http://127.0.0.1:1"))
    supervisor.mark_ready(3)
    proc = launcher.current(3)
    proc.kill_worker()
    proc.exiting = True
    return supervisor, proc


def test_a_killed_api_server_seen_after_its_subprocesses_is_reported_with_its_exit_code() -> None:
    # the kernel kills a subprocess that dies with its parent while that parent is still being torn down: the
    # supervisor may read the subprocess gone before the API server's exit code exists
    supervisor, proc = _worker_gone_while_the_api_server_exits()
    assert supervisor.check(now=10.0) == []  # the same death, not yet reapable
    proc.exit(-9)
    (death,) = supervisor.check(now=10.1)
    assert death.exit_code == -9
    assert death.detail == f"API server (pid {proc.pid}) exited with code -9"


def test_an_exit_stuck_in_the_kernel_does_not_hide_the_death() -> None:
    supervisor, proc = _worker_gone_while_the_api_server_exits()
    assert supervisor.check(now=10.0) == []
    assert supervisor.check(now=10.3) == []
    (death,) = supervisor.check(now=10.5)
    assert death.exit_code is None
    assert death.detail == f"engine subprocess(es) [{proc.worker_pid}] of API server {proc.pid} exited"
