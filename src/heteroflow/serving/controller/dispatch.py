"""One command to every NodeManager of a round at once, bounded in time (vLLM 0.34's rendezvous).

vLLM 0.34 fails a recovery round unless every survivor received the same ``request_id`` within 10 s of the first
("Not all engines joined recovery round …"). So a round's apply (``scale_down``) and a fast recovery's ``retry``
go to every NodeManager concurrently (each NodeManager sends to its engines concurrently), the whole dispatch is
bounded by ``apply_dispatch_budget_sec`` (5 s by default, at most 9), and what it took is measured: ``last_ack``
(the first send to the last acknowledgement: every survivor had its command by then) and ``spread`` (the first to
the last acknowledgement).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from heteroflow.contracts.serving import NmApplyRequest, NmApplyResponse
from heteroflow.serving.controller.clients import PeerError, PeerRejectedError
from heteroflow.serving.controller.guard import RoundFailedError
from heteroflow.serving.controller.ports import StrategyPorts


@dataclass(frozen=True, slots=True)
class Target:
    pod_id: str
    url: str
    body: NmApplyRequest


@dataclass(frozen=True, slots=True)
class Dispatched:
    answers: dict[str, NmApplyResponse]
    """Pod id → its NodeManager's answer (every target acknowledged)."""
    acknowledged_after: dict[str, float]
    """Pod id → seconds from the first send to its acknowledgement."""
    last_ack_sec: float
    spread_sec: float


async def dispatch(ctrl: StrategyPorts, request_id: str, targets: list[Target], *, budget_sec: float) -> Dispatched:
    """Send every target its body at once; :class:`RoundFailedError` when one refuses, cannot be reached, or has not
    acknowledged within ``budget_sec`` (the round stops there, before vLLM's own check-in would fail it). Each
    answer, the measured spread and a refusal are recorded on the round's timeline."""
    clock = ctrl.clock
    acked: dict[str, float] = {}
    started = clock.monotonic()

    async def one(target: Target) -> NmApplyResponse | PeerError:
        try:
            answer = await ctrl.nm.apply(target.url, target.body)
        except PeerError as exc:
            return exc
        acked[target.pod_id] = clock.monotonic() - started
        return answer

    try:
        results = await asyncio.wait_for(asyncio.gather(*(one(t) for t in targets)), timeout=budget_sec)
    except TimeoutError as exc:
        missing = sorted(t.pod_id for t in targets if t.pod_id not in acked)
        ctrl.history.add(
            request_id, "dispatch", budget_sec=budget_sec, acknowledged=dict(acked), missing=missing, ok=False
        )
        raise RoundFailedError(
            f"apply did not reach pods {missing} within {budget_sec:g} s; stopped before vLLM's 10 s check-in"
        ) from exc
    answers: dict[str, NmApplyResponse] = {}
    for target, result in zip(targets, results, strict=True):
        body = target.body.model_dump()
        if isinstance(result, PeerRejectedError):
            ctrl.history.add(request_id, "apply", pod_id=target.pod_id, body=body, http_status=result.status_code)
            raise RoundFailedError(f"apply not accepted by pod {target.pod_id}: {result}") from result
        if isinstance(result, PeerError):
            ctrl.history.add(request_id, "apply", pod_id=target.pod_id, body=body, http_status=None)
            raise RoundFailedError(f"apply not delivered to pod {target.pod_id}: {result}") from result
        answers[target.pod_id] = result
        ctrl.history.add(
            request_id,
            "apply",
            pod_id=target.pod_id,
            body=body,
            http_status=202,
            engines={r.endpoint_id: r.http_status for r in result.results},
            fenced=result.fenced_endpoint_ids,
            acknowledged_after_sec=round(acked[target.pod_id], 4),
        )
    last = max(acked.values(), default=0.0)
    spread = last - min(acked.values(), default=0.0)
    ctrl.metrics.dispatch_seconds.labels(measure="last").observe(last)
    ctrl.metrics.dispatch_seconds.labels(measure="spread").observe(spread)
    ctrl.history.add(
        request_id, "dispatch", budget_sec=budget_sec, last_ack_sec=round(last, 4), spread_sec=round(spread, 4), ok=True
    )
    return Dispatched(answers=answers, acknowledged_after=acked, last_ack_sec=last, spread_sec=spread)
