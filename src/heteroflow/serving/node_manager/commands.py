"""Command correlation: one FT command per endpoint, tracked by the id the engine knows. Purely computational.

The controller names a round by its own ``request_id``. An engine of profile ``vllm-0.34`` keeps that id and
shows it as ``last_ft_request_id`` (until its next status push); vLLM 0.32/0.33 ignore it, make a uuid of
their own, return it in the 202 and show only that one — and only with a failure's ``ft_error``, which their
next status push drops again.
So the NodeManager remembers, per endpoint, the round's id, the id the engine returned and the outcome once
seen, and rewrites each status entry the controller reads (:func:`correlate`):

- ``last_ft_request_id`` equal to the engine's id becomes the round's id, so the controller's readiness
  check recognises the answer to its own command; a rejection or failure (``ft_error``) ends its wait at once.
- An outcome once seen is kept until the round ends: an entry that dropped it (the next push) still carries
  it, unless the engine turned ``healthy`` (a success replaces a failed attempt's push).
- Where the profile has no ``ft_state``, it is inferred: ``failed`` once an ``ft_error`` for the command was
  seen, ``recovering`` while the accepted command runs (``unhealthy`` without an outcome).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from heteroflow.contracts.engine_protocol import EngineProfile, EngineStatusEntry


@dataclass(frozen=True, slots=True)
class CommandTrack:
    """The last FT command sent to one endpoint in the current round."""

    round_id: str
    engine_id: str
    """The id the engine tracks it by (its own uuid, or ``round_id`` echoed)."""
    instruction: str
    infer_ft_state: bool
    """The engine's profile sends no ``ft_state``: infer it."""
    outcome: str | None = None
    """The ``ft_error`` seen for this command (kept after the engine dropped it)."""


def track(*, round_id: str, engine_id: str | None, instruction: str, profile: EngineProfile | None) -> CommandTrack:
    """A command the engine accepted with HTTP 202; ``engine_id`` is its 202 body's ``request_id``."""
    infer = profile is not None and "ft_state" not in profile.status_fields
    return CommandTrack(
        round_id=round_id, engine_id=engine_id or round_id, instruction=instruction, infer_ft_state=infer
    )


def correlate(command: CommandTrack | None, entry: EngineStatusEntry) -> tuple[CommandTrack | None, EngineStatusEntry]:
    """The entry as the controller should read it for the current round, and the updated track."""
    if command is None:
        return None, entry
    own = entry.last_ft_request_id is not None and entry.last_ft_request_id == command.engine_id
    if own and entry.ft_error:
        command = replace(command, outcome=entry.ft_error)
    if own:
        entry = entry.model_copy(update={"last_ft_request_id": command.round_id})
    elif command.outcome is not None and entry.status != "healthy" and entry.last_ft_request_id is None:
        # the engine's next push replaced the entry: the outcome stays the round's
        entry = entry.model_copy(update={"last_ft_request_id": command.round_id, "ft_error": command.outcome})
    if command.infer_ft_state and entry.ft_state is None:
        if command.outcome is not None and entry.last_ft_request_id == command.round_id:
            entry = entry.model_copy(update={"ft_state": "failed"})
        elif command.outcome is None and entry.status == "unhealthy":
            entry = entry.model_copy(update={"ft_state": "recovering"})
    return command, entry
