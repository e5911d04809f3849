"""Typed errors of the controller core.

::

    FtCoreError                      a decision input or a requested change the rules refuse
    ├── IllegalTransitionError       a phase change F-30 does not allow
    ├── RoundStateError              a round operation out of order (apply twice, absorb after apply, …)
    └── TopologyError                the instance's topology is missing or inconsistent: fail closed (F-22)
        └── CapabilityMismatchError  the pods of one instance registered different FT capabilities (F-21)

All of them are permanent for the call that raised them: the shell does not retry the same call; it
records the error (``last_error``) and takes the fallback the runtime already froze.
"""

from __future__ import annotations


class FtCoreError(Exception):
    """Base of the controller core's errors; ``code`` is machine-readable."""

    code = "ft_core_error"


class IllegalTransitionError(FtCoreError):
    code = "illegal_transition"

    def __init__(self, current: str, target: str, detail: str = "") -> None:
        self.current = current
        self.target = target
        suffix = f": {detail}" if detail else ""
        super().__init__(f"illegal FT phase transition {current} → {target}{suffix}")


class RoundStateError(FtCoreError):
    code = "round_state"


class TopologyError(FtCoreError):
    code = "topology_incomplete"


class CapabilityMismatchError(TopologyError):
    code = "capability_mismatch"
