"""A real etcd for tests, started from the Debian binary (``etcd-server``) in a private directory.

The server listens on 127.0.0.1 on two free ports (client and peer) and keeps its data in its own temporary
directory. :meth:`EtcdServer.stop` and :meth:`EtcdServer.start` take it away and bring it back with the same
data and ports (an outage); :meth:`EtcdServer.pause` and :meth:`EtcdServer.resume` freeze it (SIGSTOP), so a
test can see a request hang until the store's deadline instead of being refused at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from heteroflow.core.testing import free_port

START_TIMEOUT_SEC = 30.0
"""How long a start may take before the test fails: etcd is usually healthy in under a second."""


class EtcdUnavailableError(RuntimeError):
    """No etcd server binary on this machine."""


def find_etcd_bin() -> Path:
    """``etcd`` on PATH, else Debian's ``/usr/bin/etcd``."""
    found = shutil.which("etcd")
    if found:
        return Path(found)
    debian = Path("/usr/bin/etcd")
    if debian.is_file() and os.access(debian, os.X_OK):
        return debian
    raise EtcdUnavailableError("etcd server binary not found (apt-get install etcd-server)")


class EtcdServer:
    """One single-member etcd cluster; call :meth:`start` after construction and :meth:`close` at the end."""

    def __init__(self) -> None:
        self.binary = find_etcd_bin()
        self.client_port = free_port()
        self.peer_port = free_port()
        while self.peer_port == self.client_port:
            self.peer_port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="hf-etcd-"))
        self.data_dir = self.root / "data"
        self.log_path = self.root / "etcd.log"
        self._process: subprocess.Popen[bytes] | None = None
        self._paused = False

    @property
    def running(self) -> bool:
        return self._process is not None

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:PORT``, what :class:`~.etcd.EtcdFtRuntimeStore` takes."""
        return f"127.0.0.1:{self.client_port}"

    def url(self, prefix: str | None = None) -> str:
        """An ``etcd://`` store URL for :func:`~heteroflow.serving.controller.store.open_store`."""
        return f"etcd://{self.endpoint}" + (f"?prefix={prefix}" if prefix is not None else "")

    def start(self) -> None:
        """Starts etcd (on the same data and ports as before, after a :meth:`stop`) and waits until healthy."""
        if self._process is not None:
            return
        peer = f"http://127.0.0.1:{self.peer_port}"
        client = f"http://{self.endpoint}"
        command = [
            str(self.binary),
            "--name=default",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}",
            "--log-level=warn",
            # a single member on loopback: it elects itself after one election timeout (1 s by default), paid at
            # every start and restart of a test's etcd (0.1-0.2 s to healthy instead of 0.8-1.6 s); 20 ms
            # heartbeats keep the 5x ratio etcd asks for, at about 1 % of a core idle instead of 0.25 %
            "--heartbeat-interval=20",
            "--election-timeout=100",
        ]
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(  # noqa: S603 - our own binary and arguments
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        self._wait_healthy()

    def stop(self) -> None:
        """Terminates etcd and waits for it to exit (its data stays)."""
        process, self._process = self._process, None
        if process is None:
            return
        if self._paused:
            process.send_signal(signal.SIGCONT)
            self._paused = False
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    def pause(self) -> None:
        """Freezes etcd (SIGSTOP): connections stay open and requests hang."""
        if self._process is None:
            raise RuntimeError("etcd is not running")
        self._process.send_signal(signal.SIGSTOP)
        self._paused = True
        # The signal is delivered asynchronously: until the kernel reports the process stopped, etcd may still
        # answer a request sent right after this call.
        tasks = Path(f"/proc/{self._process.pid}/task")
        deadline = time.monotonic() + START_TIMEOUT_SEC
        while not _all_threads_stopped(tasks):
            if time.monotonic() > deadline:
                raise RuntimeError(f"etcd (pid {self._process.pid}) did not stop after SIGSTOP")
            time.sleep(0.001)  # a poll interval under a deadline

    def resume(self) -> None:
        """Unfreezes etcd (SIGCONT) and waits until it answers again."""
        if self._process is None or not self._paused:
            return
        self._process.send_signal(signal.SIGCONT)
        self._paused = False
        self._wait_healthy()

    def close(self) -> None:
        """Kills etcd and removes its directory."""
        try:
            if self._process is not None:
                if self._paused:
                    self._process.send_signal(signal.SIGCONT)
                self._process.kill()
                self._process.wait(timeout=10)
                self._process = None
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def _wait_healthy(self) -> None:
        """Polls ``/health`` (true only once the member has a leader) until it says so, or fails loudly."""
        deadline = time.monotonic() + START_TIMEOUT_SEC
        url = f"http://{self.endpoint}/health"
        while True:
            process = self._process
            if process is None or process.poll() is not None:
                self._process = None
                raise RuntimeError(f"etcd exited during start-up; log:\n{self._log_tail()}")
            if self._healthy(url):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"etcd not healthy after {START_TIMEOUT_SEC} s; log:\n{self._log_tail()}")
            time.sleep(0.02)  # a poll interval under a deadline, not a wait standing in for readiness

    @staticmethod
    def _healthy(url: str) -> bool:
        # No proxy: an http_proxy in the environment must not intercept a loopback health check.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(url, timeout=1.0) as response:
                body = json.loads(response.read())
        except (urllib.error.URLError, OSError, ValueError):
            return False
        return isinstance(body, dict) and body.get("health") == "true"

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-4000:]
        return "(no log)"


def _all_threads_stopped(tasks: Path) -> bool:
    """Whether every thread under ``/proc/PID/task`` is stopped by a signal (state ``T``)."""
    try:
        # The state follows the command name in parentheses, which may itself hold spaces or parentheses.
        states = [(task / "stat").read_text().rpartition(")")[2].split()[0] for task in tasks.iterdir()]
    except (OSError, IndexError):
        return False
    return bool(states) and all(state == "T" for state in states)
