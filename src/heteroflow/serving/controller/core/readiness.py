"""A round's survivor polls, judged (``serving-ft.md`` F-24, F-26, F-51; RFC §5). Purely computational.

Before apply (:func:`before_apply`): a survivor turned DEAD joins the round's removal set (absorbed); the
rest must all be UNHEALTHY with no ``ft_state``; HEALTHY, DIAGNOSING (vLLM 0.34: a fault that cannot take a
command yet) or recovering → keep polling; failed, missing, id
mismatch, protocol error, a query error beyond ``max_transient_query_errors`` (default 0), no survivor
left, or the deadline → fail. After apply (:func:`after_apply`): every survivor healthy with empty
``ft_state`` → commit; any failed or dead, a query error beyond the tolerance, or the deadline → fail.
Nothing here ever says "apply again".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from heteroflow.contracts.serving import TERMINAL_FAILURE, EndpointFtStatus

from .ranks import DpRank, ranks

Verdict = Literal["ready", "poll", "absorb", "fail", "commit"]


@dataclass(frozen=True, slots=True)
class PollVerdict:
    verdict: Verdict
    reason: str = ""
    absorbed: frozenset[DpRank] = frozenset()
    transient_errors: int = 0
    """The round's count of tolerated transient query errors after this poll (F-51)."""
    terminal: bool = False
    """A ``fail`` by vLLM's terminal signal (dead, "Recovery failed; full restart required"): the whole instance
    must restart, whatever fallback was frozen; a retryable failure (``ft_state`` failed, still unhealthy) is not."""


@dataclass(frozen=True, slots=True)
class PollLimits:
    deadline: float
    """Monotonic seconds: this stage's ``execution_deadline_sec`` from its start."""
    max_transient_query_errors: int = 0
    transient_errors: int = 0
    """Tolerated so far in this round."""


def _index(entries: Iterable[EndpointFtStatus], survivors: frozenset[DpRank]) -> dict[DpRank, EndpointFtStatus] | str:
    found: dict[DpRank, EndpointFtStatus] = {}
    for entry in entries:
        rank = DpRank(entry.endpoint_id)
        if rank not in survivors:
            return f"answer for rank {rank}, which was not asked"
        if rank in found:
            return f"rank {rank} answered twice"
        if entry.status is not None and entry.status.id != entry.endpoint_id:
            return f"engine id {entry.status.id} answered for endpoint {entry.endpoint_id}"
        found[rank] = entry
    missing = survivors - found.keys()
    if missing:
        return f"no answer for survivors {sorted(missing)}"
    return found


def _transient(limits: PollLimits, rank: DpRank, detail: str) -> PollVerdict:
    if limits.transient_errors < limits.max_transient_query_errors:
        return PollVerdict(
            "poll", f"transient query error on rank {rank}", transient_errors=limits.transient_errors + 1
        )
    return PollVerdict("fail", f"query error on rank {rank}: {detail or 'unreachable'}")


def before_apply(
    entries: Iterable[EndpointFtStatus], *, survivors: Iterable[int], limits: PollLimits, now: float
) -> PollVerdict:
    """F-24: ``ready`` (apply now), ``poll``, ``absorb`` (these survivors are DEAD: regroup, poll again) or ``fail``."""
    survivor_set = ranks(survivors)
    if not survivor_set:
        return PollVerdict("fail", "empty survivor set")
    if now >= limits.deadline:
        return PollVerdict("fail", "apply-ready deadline passed")
    found = _index(entries, survivor_set)
    if isinstance(found, str):
        return PollVerdict("fail", found)
    dead: set[DpRank] = set()
    waiting: list[str] = []
    transient: PollVerdict | None = None
    for rank, entry in sorted(found.items()):
        if entry.error == "unreachable":
            transient = _transient(limits, rank, entry.detail)
            if transient.verdict == "fail":
                return transient
            continue
        if entry.error == "not_running":
            dead.add(rank)  # its process is gone: DEAD evidence (F-2), absorbed like an engine-reported dead
            continue
        if entry.error is not None or entry.status is None:
            return PollVerdict("fail", f"rank {rank}: {entry.error or 'no status'} {entry.detail}".strip())
        status = entry.status
        if status.status == "dead":
            dead.add(rank)
        elif status.ft_state == "failed":
            return PollVerdict("fail", f"rank {rank} reports ft_state failed: {status.ft_error or ''}".strip())
        elif status.status in ("healthy", "diagnosing") or status.ft_state == "recovering":
            waiting.append(f"rank {rank} {status.status}{' recovering' if status.ft_state else ''}")
    if dead:
        if dead == survivor_set:
            return PollVerdict("fail", "no survivor left: every survivor is DEAD")
        return PollVerdict("absorb", f"ranks {sorted(dead)} turned DEAD", absorbed=frozenset(dead))
    if transient is not None:
        return transient
    if waiting:
        return PollVerdict("poll", "; ".join(waiting), transient_errors=limits.transient_errors)
    return PollVerdict("ready", transient_errors=limits.transient_errors)


def after_apply(
    entries: Iterable[EndpointFtStatus], *, survivors: Iterable[int], request_id: str, limits: PollLimits, now: float
) -> PollVerdict:
    """F-26: ``commit`` (every survivor healthy, empty ``ft_state``), ``poll`` or ``fail``; never a second apply."""
    survivor_set = ranks(survivors)
    if now >= limits.deadline:
        return PollVerdict("fail", "post-apply deadline passed")
    found = _index(entries, survivor_set)
    if isinstance(found, str):
        return PollVerdict("fail", found)
    transient: PollVerdict | None = None
    pending = False
    for rank, entry in sorted(found.items()):
        if entry.error == "unreachable":
            transient = _transient(limits, rank, entry.detail)
            if transient.verdict == "fail":
                return transient
            continue
        if entry.error is not None or entry.status is None:
            return PollVerdict("fail", f"rank {rank}: {entry.error or 'no status'} {entry.detail}".strip())
        status = entry.status
        if TERMINAL_FAILURE(status):
            # vLLM's own signal: the scale_down failed for good; only the whole instance can be restarted
            return PollVerdict(
                "fail", f"rank {rank} failed terminally: {status.fault_info or status.ft_error}", terminal=True
            )
        if status.status == "dead" or status.ft_state == "failed":
            return PollVerdict("fail", f"rank {rank} {status.status} after apply {status.ft_error or ''}".strip())
        if status.ft_error and status.last_ft_request_id == request_id:
            return PollVerdict("fail", f"rank {rank} rejected the apply: {status.ft_error}")
        if status.status != "healthy" or status.ft_state is not None:
            pending = True
    if transient is not None:
        return transient
    if pending:
        return PollVerdict("poll", "survivors still recovering", transient_errors=limits.transient_errors)
    return PollVerdict("commit", transient_errors=limits.transient_errors)
