"""What a round's clients saw, asked of the Coordinator once the round is over (``GET /coordinator/client_outcomes``).

The window runs from the round's first fault evidence (its decision, when the trigger has none) to now, a short
settle after the round ended, so that the requests held until the view came back are counted too (they finish
within milliseconds of the publication). The answer becomes the round record's ``clients``; when the Coordinator
could not be asked, ``clients`` says so (``error``) and holds no counts: unknown is never 0.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import structlog

from heteroflow.serving.controller.clients import PeerError
from heteroflow.serving.controller.instance import Instance
from heteroflow.serving.controller.ports import PublicationPorts

_log = structlog.get_logger(__name__)

SETTLE_SEC = 1.0
"""How long after a round ended the Coordinator is asked: a held request finishes right after the publication."""
_COUNTS = ("held", "rerouted", "resumed", "failed", "longest_wait_sec", "complete")


def _window_start(times: dict[str, str | None], started_at: datetime) -> float:
    for name in ("fault_at", "decided_at"):
        value = times.get(name)
        if value:
            try:
                return datetime.fromisoformat(value).timestamp()
            except ValueError:
                continue
    return started_at.timestamp()


def ask_after(ctrl: PublicationPorts, inst: Instance, request_ids: list[str]) -> None:
    """Ask the Coordinator for each finished round of ``request_ids`` that has no ``clients`` yet."""
    pending = [rid for rid in request_ids if (r := ctrl.history.get(rid)) is not None and r.clients is None]
    if not pending:
        return
    coordinator = ctrl.coordinator
    if coordinator is None:
        for rid in pending:
            ctrl.history.set_clients(rid, {"error": "no Coordinator configured", "as_of": None})
        return

    async def ask() -> None:
        await ctrl.clock.sleep(SETTLE_SEC)
        for rid in pending:
            record = ctrl.history.get(rid)
            if record is None:
                continue
            now = ctrl.clock.now()
            found: dict[str, Any]
            try:
                answer = await coordinator.client_outcomes(
                    since=_window_start(record.times, record.started_at),
                    until=now.timestamp(),
                    model=ctrl.model_of(inst),
                    instance_id=inst.instance_id,
                )
                found = {k: answer.get(k) for k in _COUNTS}
                found["error"] = None
            except PeerError as exc:
                _log.warning("controller.client_outcomes_failed", request_id=rid, error=str(exc))
                found = {"error": str(exc)}
            found["as_of"] = now.isoformat()
            ctrl.history.set_clients(rid, found)

    ctrl.spawn(ask(), name=f"client-outcomes-{inst.instance_id}")
