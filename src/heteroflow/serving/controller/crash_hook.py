"""The test-only crash hook of the controller (``HETEROFLOW_CONTROLLER_CRASH_AT_STEP``): where a round can stop."""

from __future__ import annotations

CRASH_EXIT_CODE = 86
"""Exit code of the test-only crash hook (``HETEROFLOW_CONTROLLER_CRASH_AT_STEP``)."""

CRASH_STEPS = (
    "after_write_ahead",
    "after_guard",
    "before_apply",
    "after_apply",
    "after_node_manager_commit",
    "after_commit_persisted",
    "after_round_persisted",
)
"""The step boundaries of a round at which the crash hook can stop the process."""
