"""The NodeManager's frozen status objects (``GET /node-manager/status``, ``/metrics``, and the tests)."""

from __future__ import annotations

from dataclasses import dataclass

from heteroflow.serving.wire import FtFlags


@dataclass(frozen=True, slots=True)
class FencingViolation:
    """A retired rank that answered again (F-53)."""

    endpoint_id: int
    detail: str
    fenced: bool
    at_monotonic: float


@dataclass(frozen=True, slots=True)
class EndpointStatus:
    endpoint_id: int
    retired: bool
    running: bool
    ready: bool
    incarnation: int | None
    pid: int | None
    start_time: float | None
    ft_status: str
    """Last poll: unknown / healthy / unhealthy / dead / protocol_error."""
    dead_by_unreachability: bool
    polls: int


@dataclass(frozen=True, slots=True)
class NodeManagerStatus:
    """What the NodeManager holds now; ``GET /node-manager/status`` and the tests read this."""

    pod_id: str
    instance_id: str
    registered: bool
    flags: FtFlags
    guard_request_id: str | None
    guard_lease_left_sec: float
    frozen: bool
    retired: tuple[int, ...]
    endpoints: tuple[EndpointStatus, ...]
    reports_sent: int
    reports_pending: int
    heartbeats_sent: int
    fencing_violations: tuple[FencingViolation, ...]
    finalized_rounds: tuple[tuple[str, bool], ...]
    suicide_reason: str | None
    config_warnings: tuple[str, ...]
