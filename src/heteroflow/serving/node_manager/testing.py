"""Test doubles of the NodeManager's seams, shipped for its tests and for the controller's.

- :class:`FakeController` — an in-process controller that records what NodeManagers send it. It is a
  :class:`~.client.ControllerClient` itself (no HTTP), and :meth:`FakeController.app` serves the same
  recorder over the real routes and token check, so the HTTP client is tested against it too.
- :class:`FakeLauncher` — a :class:`~.supervisor.ProcessLauncher` without processes: each engine is a
  :class:`FakeProcess` with one fake worker subprocess that a test can kill.
- :func:`fake_cluster_launcher` — a :class:`FakeLauncher` bound to an in-process
  :class:`~heteroflow.engine_sim.testing.FakeEngineCluster`: killing a fake process makes that engine
  unreachable, and an engine that exits makes its fake process exit.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
from collections.abc import Callable
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from heteroflow.contracts.serving import (
    HEARTBEAT_PATH,
    REGISTER_PATH,
    REPORT_SOFTWARE_FAULT_PATH,
    EngineIdentity,
    FaultEvidence,
    FtFlags,
    HeartbeatRequest,
    HeartbeatResponse,
    RegisterRequest,
    RegisterResponse,
    SoftwareFaultReport,
    heartbeat_complete,
)
from heteroflow.engine_sim.backend import FaultKind
from heteroflow.engine_sim.testing import FakeEngineCluster
from heteroflow.serving.node_manager.client import ControllerUnavailableError
from heteroflow.serving.node_manager.spec import EngineCommand

TEST_CLUSTER_TOKEN = "node-manager-test-token"  # noqa: S105 - a fixture value, not a secret


@dataclass
class RecordedHeartbeat:
    request: HeartbeatRequest
    complete: bool
    """F-4's judgement under the flags the controller had when it received the beat."""


@dataclass
class FakeController:
    """Records registrations, heartbeats and fault reports; answers with :attr:`flags`."""

    flags: FtFlags = field(default_factory=FtFlags)
    heartbeat_interval_sec: float = 5.0
    retired_on_register: list[int] | None = None
    unavailable: bool = False
    registrations: list[RegisterRequest] = field(default_factory=list)
    heartbeats: list[RecordedHeartbeat] = field(default_factory=list)
    reports: list[SoftwareFaultReport] = field(default_factory=list)

    # -- ControllerClient ----------------------------------------------------------------------------------
    async def register(self, request: RegisterRequest) -> RegisterResponse:
        self._check()
        self.registrations.append(request)
        return RegisterResponse(
            flags=self.flags,
            heartbeat_interval_sec=self.heartbeat_interval_sec,
            retired_endpoint_ids=self.retired_on_register,
        )

    async def heartbeat(self, request: HeartbeatRequest) -> HeartbeatResponse:
        self._check()
        complete = heartbeat_complete(
            reported=request.endpoint_ids,
            expected=request.expected_endpoint_ids,
            retired=request.retired_endpoint_ids,
            scale_down_enabled=self.flags.enable_dp_scale_down_proxy,
        )
        self.heartbeats.append(RecordedHeartbeat(request=request, complete=complete))
        return HeartbeatResponse(flags=self.flags)

    async def report_software_fault(self, report: SoftwareFaultReport) -> None:
        await asyncio.sleep(0)  # a real controller is I/O: let other tasks interleave here, as they would
        self._check()
        self.reports.append(report)

    async def aclose(self) -> None:
        return None

    def _check(self) -> None:
        if self.unavailable:
            raise ControllerUnavailableError("fake controller is down")

    # -- queries ---------------------------------------------------------------------------------------------
    def reports_for(self, endpoint_id: int, evidence: FaultEvidence | None = None) -> list[SoftwareFaultReport]:
        return [
            r for r in self.reports if r.endpoint_id == endpoint_id and (evidence is None or r.evidence == evidence)
        ]

    # -- the same recorder over HTTP ------------------------------------------------------------------------
    def app(self, *, cluster_token: str | None) -> FastAPI:
        app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

        def authorized(request: Request) -> bool:
            return not cluster_token or request.headers.get("authorization") == f"Bearer {cluster_token}"

        async def handle(request: Request, kind: str) -> Response:
            if not authorized(request):
                return JSONResponse({"detail": "unauthorized"}, status_code=401)
            try:
                raw = await request.body()
                if kind == "register":
                    answer = await self.register(RegisterRequest.model_validate_json(raw))
                    return JSONResponse(answer.model_dump(mode="json"))
                if kind == "heartbeat":
                    beat = await self.heartbeat(HeartbeatRequest.model_validate_json(raw))
                    return JSONResponse(beat.model_dump(mode="json"))
                await self.report_software_fault(SoftwareFaultReport.model_validate_json(raw))
                return JSONResponse({"accepted": True})
            except ValidationError as exc:
                return JSONResponse({"detail": exc.errors()[0]["msg"]}, status_code=400)
            except ControllerUnavailableError:
                return JSONResponse({"detail": "unavailable"}, status_code=503)

        @app.post(REGISTER_PATH)
        async def register(request: Request) -> Response:
            return await handle(request, "register")

        @app.post(HEARTBEAT_PATH)
        async def heartbeat(request: Request) -> Response:
            return await handle(request, "heartbeat")

        @app.post(REPORT_SOFTWARE_FAULT_PATH)
        async def report(request: Request) -> Response:
            return await handle(request, "report")

        return app


_pids = itertools.count(40_000)


class FakeProcess:
    """An engine 'process' with one worker subprocess; implements :class:`~.supervisor.ProcessHandle`."""

    def __init__(self, command: EngineCommand, *, on_kill: Callable[[], None] | None = None) -> None:
        self.command = command
        self._pid = next(_pids)
        self.worker_pid = next(_pids)
        self._code: int | None = None
        self._worker_gone = False
        self.worker_stopped = False
        """Set by a test: the worker is stopped (SIGSTOP) until cleared."""
        self._on_kill = on_kill
        self.signals: list[signal.Signals] = []
        self.external_exit: Callable[[], bool] = lambda: False
        self.exiting = False
        """Set by a test: the API server is in the kernel's exit path (its exit code not yet readable)."""

    @property
    def pid(self) -> int:
        return self._pid

    def exit(self, code: int) -> None:
        if self._code is None:
            self._code = code
            self._worker_gone = True

    def kill_worker(self) -> None:
        self._worker_gone = True

    def exit_code(self) -> int | None:
        if self._code is None and self.external_exit():
            self._code = 1
            self._worker_gone = True
        return self._code

    def descendants(self) -> frozenset[int]:
        return frozenset() if self._worker_gone else frozenset({self.worker_pid})

    def is_gone(self, pid: int) -> bool:
        return pid == self.worker_pid and self._worker_gone

    def is_stopped(self, pid: int) -> bool:
        return pid == self.worker_pid and self.worker_stopped and not self._worker_gone

    def is_exiting(self) -> bool:
        return self.exiting

    def identity(self) -> EngineIdentity | None:
        return EngineIdentity(pid=self._pid, start_time=1_767_225_600.0 + self._pid)

    def signal_session(self, sig: signal.Signals) -> None:
        self.signals.append(sig)
        if sig in (signal.SIGKILL, signal.SIGTERM) and self._code is None:
            self.exit(-int(sig))
            if self._on_kill is not None:
                self._on_kill()

    def wait(self, timeout: float) -> bool:
        _ = timeout
        return self._code is not None


class FakeLauncher:
    """Records every launch; ``on_kill(endpoint_id)`` runs when a fake process is killed."""

    def __init__(
        self,
        *,
        on_kill: Callable[[int], None] | None = None,
        is_gone: Callable[[int], bool] | None = None,
        on_launch: Callable[[int], None] | None = None,
    ) -> None:
        self.launched: list[FakeProcess] = []
        self._on_kill = on_kill
        self._is_gone = is_gone
        self._on_launch = on_launch

    def launch(self, command: EngineCommand) -> FakeProcess:
        endpoint_id = command.endpoint_id
        on_kill = self._on_kill
        proc = FakeProcess(command, on_kill=None if on_kill is None else (lambda: on_kill(endpoint_id)))
        if self._is_gone is not None:
            is_gone = self._is_gone
            proc.external_exit = lambda: is_gone(endpoint_id)
        if self._on_launch is not None:
            self._on_launch(endpoint_id)
        self.launched.append(proc)
        return proc

    def current(self, endpoint_id: int) -> FakeProcess:
        return [p for p in self.launched if p.command.endpoint_id == endpoint_id][-1]


def fake_cluster_launcher(cluster: FakeEngineCluster) -> FakeLauncher:
    """Fake processes standing for the engines of an in-process cluster (see the module docstring)."""

    def kill(endpoint_id: int) -> None:
        core = cluster.cores.get(endpoint_id)
        if core is not None:
            cluster.backends[endpoint_id].inject(FaultKind.KILL_PROCESS)
            core.exit_requested.set()  # the engine's port now refuses connections, like a killed process

    return FakeLauncher(on_kill=kill, is_gone=cluster.is_gone)
