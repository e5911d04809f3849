"""The guard a round and a fast recovery put on every pod of an instance (``serving-ft.md`` F-23, F-58).

A guard freezes a pod's local decisions for one ``request_id`` for ``lease_sec``; :class:`RoundGuard` takes it on
every pod at once and renews it every third of the lease while the strategy runs. A refused guard, or any other
reason the strategy cannot go on, is a :class:`RoundFailedError`: before commit, abort and the frozen fallback.
"""

from __future__ import annotations

import asyncio
import contextlib

from heteroflow.contracts.serving import GuardRequest, GuardResponse
from heteroflow.serving.controller.clients import PeerError
from heteroflow.serving.controller.core.topology import guard_lease_sec
from heteroflow.serving.controller.instance import Instance
from heteroflow.serving.controller.ports import StrategyPorts


class RoundFailedError(Exception):
    """The round cannot go on; before commit this means abort + the frozen fallback.

    ``terminal``: the engines said recovery is over (vLLM 0.34: a failed ``scale_down`` leaves them dead with
    "Recovery failed; full restart required"): the whole instance restarts at once, whatever the frozen fallback.
    """

    def __init__(self, message: str, *, terminal: bool = False) -> None:
        super().__init__(message)
        self.terminal = terminal


class RoundGuard:
    """Guards every pod of the round and renews the lease while the round runs (F-23, F-58)."""

    def __init__(self, ctrl: StrategyPorts, inst: Instance, request_id: str) -> None:
        self._ctrl, self._inst, self._request_id = ctrl, inst, request_id
        self.lease_sec = guard_lease_sec(ctrl.ft.round_timings())
        self._task: asyncio.Task[None] | None = None
        self.renewal_error: str | None = None

    async def acquire(self) -> None:
        """Guard every pod at once (a guard only freezes a pod's local decisions, and a round that fails releases
        every guard with finalize(abort) whichever pods it reached); the answers are judged in the pods' order."""
        pods = self._inst.topology.pods
        body = GuardRequest(request_id=self._request_id, lease_sec=self.lease_sec)

        async def one(url: str) -> GuardResponse | PeerError:
            try:
                return await self._ctrl.nm.guard(url, body)
            except PeerError as exc:
                return exc

        answers = await asyncio.gather(*(one(pod.node_manager_url) for pod in pods))
        for pod, answer in zip(pods, answers, strict=True):
            if isinstance(answer, PeerError):
                self._ctrl.history.add(self._request_id, "guard_failed", pod_id=pod.pod_id, error=str(answer))
                raise RoundFailedError(f"guard refused by pod {pod.pod_id}: {answer}") from answer
            self._ctrl.history.add(
                self._request_id, "guard", pod_id=pod.pod_id, lease_sec=self.lease_sec, renewed=answer.renewed
            )
        self._task = asyncio.create_task(self._renew())

    async def _renew(self) -> None:
        while True:
            await self._ctrl.clock.sleep(self.lease_sec / 3)  # the renewal period, a third of the lease
            for pod in self._inst.topology.pods:
                try:
                    await self._ctrl.nm.guard(
                        pod.node_manager_url, GuardRequest(request_id=self._request_id, lease_sec=self.lease_sec)
                    )
                except PeerError as exc:
                    self.renewal_error = f"lease renewal failed on pod {pod.pod_id}: {exc}"
                    self._ctrl.history.add(self._request_id, "guard_renewal_failed", pod_id=pod.pod_id, error=str(exc))

    async def release(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
