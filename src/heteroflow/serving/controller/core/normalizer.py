"""FaultNormalizer: software evidence → the FT snapshot of the active ranks; hardware faults → original DP
ranks (``serving-ft.md`` F-1…F-4, F-10, F-12; RFC §4.1, §4.2). Purely computational.

Software. Only DEAD makes a removable rank; UNHEALTHY marks a survivor that can take the apply and is
never a removal candidate. DEAD comes from the engine's ``dead``, the ProcessSupervisor's ``ENGINE_DEAD``, or
the poller's timeout/connection failure (``FT_UNREACHABLE``), and is sticky until commit or rebuild (only
:func:`reset` forgets it). A protocol error is neither: it leaves the rank unknown, so the snapshot stays
incomplete rather than healthy. The engine ``mask`` is diagnosis only and is never read here.

Hardware. A fault names a node and a card; the instance's pods on that node and their endpoints'
``device_infos`` give the original DP ranks (union across pods). An empty card name is a node-level fault:
every DP rank of the instance on that node. A card name whose format we do not know is never guessed at.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Literal

from heteroflow.contracts.serving import FaultEvidence, SoftwareFaultReport

from .ranks import DpRank, ranks
from .topology import InstanceTopology

RankHealth = Literal["diagnosing", "unhealthy", "dead", "unknown"]
"""``diagnosing`` (vLLM 0.34) is a fault that cannot take a command yet: it keeps the snapshot incomplete (wait),
never removable, never a protocol error."""


@dataclass(frozen=True, slots=True)
class RankEvidence:
    status: RankHealth
    first_seen: float
    """Monotonic seconds when the controller first saw this status for the rank (in memory only, F-13)."""
    evidence: FaultEvidence


@dataclass(frozen=True, slots=True)
class FtSnapshot:
    """The controller's in-memory software evidence for one instance; ranks without an entry are healthy."""

    entries: Mapping[DpRank, RankEvidence] = field(default_factory=lambda: MappingProxyType({}))

    def status(self, rank: int) -> RankHealth | Literal["healthy"]:
        entry = self.entries.get(DpRank(rank))
        return "healthy" if entry is None else entry.status


def observe(
    snapshot: FtSnapshot, report: SoftwareFaultReport, *, now: float, dead_committed: Iterable[int]
) -> FtSnapshot:
    """The snapshot after one report (F-1, F-2, F-4, F-10).

    Committed ranks are ignored (they are retired). DEAD never reverts. UNHEALTHY keeps its first-seen time
    while it lasts. A protocol error turns a non-DEAD rank unknown.
    """
    rank = DpRank(report.endpoint_id)
    if rank in ranks(dead_committed):
        return snapshot
    current = snapshot.entries.get(rank)
    if current is not None and current.status == "dead":
        return snapshot  # sticky until commit or rebuild
    status: RankHealth
    if report.status == "dead" or report.evidence in (FaultEvidence.ENGINE_DEAD, FaultEvidence.FT_UNREACHABLE):
        status = "dead"
    elif report.status == "unhealthy":
        status = "unhealthy"
    elif report.status == "diagnosing":
        status = "diagnosing"
    else:
        status = "unknown"
    if current is not None and current.status == status:
        return snapshot
    entries = dict(snapshot.entries)
    entries[rank] = RankEvidence(status=status, first_seen=now, evidence=report.evidence)
    return FtSnapshot(entries=MappingProxyType(entries))


def forget(snapshot: FtSnapshot, rank: int) -> FtSnapshot:
    """The snapshot without ``rank``'s evidence: DEAD by unreachability withdrawn because the same engine
    answered again before a round started (the shell checks that; DEAD from any other source never reverts)."""
    if DpRank(rank) not in snapshot.entries:
        return snapshot
    entries = {r: e for r, e in snapshot.entries.items() if r != rank}
    return FtSnapshot(entries=MappingProxyType(entries))


def reset() -> FtSnapshot:
    """Forget every observation: a round ended or the instance was rebuilt (F-13)."""
    return FtSnapshot()


class SnapshotKind(StrEnum):
    NONE = "NONE"
    """No evidence on any active rank: nothing to decide."""
    ALL_UNHEALTHY = "ALL_UNHEALTHY"
    """Every active rank UNHEALTHY, no DEAD: fast recovery may apply; nothing may be removed."""
    COMPLETE = "COMPLETE"
    """At least one UNHEALTHY and one DEAD, together exactly the active ranks: a scale-down round."""
    ALL_DEAD = "ALL_DEAD"
    """Every active rank DEAD: no survivor, reconfiguration."""
    INCOMPLETE = "INCOMPLETE"
    """Some active rank is healthy or unknown: wait for evidence, or time out."""


@dataclass(frozen=True, slots=True)
class Classified:
    kind: SnapshotKind
    dead: frozenset[DpRank]
    unhealthy: frozenset[DpRank]
    collection_started_at: float | None
    """The earliest first-seen time among the active ranks (the collection start, F-10)."""
    settled_since: float | None
    """When the snapshot last changed on an active rank (the start of F-59's stability window)."""


def classify(snapshot: FtSnapshot, active: Iterable[int]) -> Classified:
    """Classify the snapshot of the active ranks (original - dead_committed) as F-10 does."""
    active_set = ranks(active)
    entries = {rank: entry for rank, entry in snapshot.entries.items() if rank in active_set}
    dead = frozenset(r for r, e in entries.items() if e.status == "dead")
    unhealthy = frozenset(r for r, e in entries.items() if e.status == "unhealthy")
    started = min((e.first_seen for e in entries.values()), default=None)
    settled = max((e.first_seen for e in entries.values()), default=None)
    if not entries:
        kind = SnapshotKind.NONE
    elif active_set and dead == active_set:
        kind = SnapshotKind.ALL_DEAD
    elif unhealthy == active_set:
        kind = SnapshotKind.ALL_UNHEALTHY
    elif dead and unhealthy and dead | unhealthy == active_set:
        kind = SnapshotKind.COMPLETE
    else:
        kind = SnapshotKind.INCOMPLETE
    return Classified(kind=kind, dead=dead, unhealthy=unhealthy, collection_started_at=started, settled_since=settled)


# == hardware (F-3, F-12) =========================================================================================
@dataclass(frozen=True, slots=True)
class HardwareFault:
    """One card- or node-level hardware fault (MindCluster ConfigMap entry or a HeteroFlow GPU-health event)."""

    node_name: str
    card: str
    """Card name or uuid (``Ascend910-4``, ``GPU-…`` uuid, or a bare device index); empty = node-level."""
    fault_code: str
    level: int
    """L1…L6 (``engine-protocol.md``'s level mapping); only L4-L6 start a correlation window."""

    @property
    def key(self) -> str:
        """Several cards with the same fault code are told apart by (fault_code, card[, node_name])."""
        return f"{self.fault_code}|{self.card}|{self.node_name}"

    @property
    def correlatable(self) -> bool:
        return 4 <= self.level <= 6


class MappingKind(StrEnum):
    MAPPED = "MAPPED"
    NOT_AFFECTED = "NOT_AFFECTED"
    """The instance has no pod on that node, or none of its endpoints uses that card."""
    UNMAPPABLE = "UNMAPPABLE"
    """Unknown card-name format or missing topology: no guess, the original strategy (A14)."""


@dataclass(frozen=True, slots=True)
class HardwareMapping:
    kind: MappingKind
    ranks: frozenset[DpRank] = frozenset()
    reason: str = ""
    reason_code: str = ""
    """A stable code for ``reason`` (the dashboard words it in the reader's language), ``""`` for none."""
    reason_subject: str = ""
    """What the reason names: a node name, a card or an endpoint id."""


_GPU_UUID = re.compile(r"^GPU-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")
_CHIP_INDEX = re.compile(r"^[A-Za-z][A-Za-z0-9]*-(\d+)$")
_INDEX = re.compile(r"^\d+$")


def _card_matcher(card: str) -> tuple[str, int | None] | None:
    """(exact device id to match, device index to match) for a known card-name format, else ``None``."""
    if _GPU_UUID.match(card):
        return card.lower(), None
    chip = _CHIP_INDEX.match(card)
    if chip:
        return card.lower(), int(chip.group(1))
    if _INDEX.match(card):
        return card, int(card)
    return None


def map_hardware_fault(fault: HardwareFault, topology: InstanceTopology) -> HardwareMapping:
    """Original DP ranks of ``topology`` hit by ``fault`` (F-3): node → the instance's pods on it → their
    endpoints' ``device_infos`` → endpoint ids, united across pods."""
    if any(not pod.node_name for pod in topology.pods):
        return HardwareMapping(
            MappingKind.UNMAPPABLE, reason="a pod of the instance registered no node name", reason_code="no_node_name"
        )
    pods = [pod for pod in topology.pods if pod.node_name == fault.node_name]
    if not pods:
        return HardwareMapping(
            MappingKind.NOT_AFFECTED,
            reason=f"no pod of the instance on {fault.node_name!r}",
            reason_code="node_not_in_instance",
            reason_subject=fault.node_name,
        )
    if not fault.card:  # node-level: every DP of the instance on that node
        hit = frozenset().union(*(pod.dp_ranks for pod in pods))
        return HardwareMapping(MappingKind.MAPPED, ranks=hit, reason="node-level fault", reason_code="node_level")
    matcher = _card_matcher(fault.card)
    if matcher is None:
        return HardwareMapping(
            MappingKind.UNMAPPABLE,
            reason=f"unknown card-name format {fault.card!r}",
            reason_code="unknown_card_format",
            reason_subject=fault.card,
        )
    device_id, index = matcher
    hit_ranks: set[int] = set()
    for pod in pods:
        for endpoint in pod.endpoints:
            if not endpoint.device_infos:
                return HardwareMapping(
                    MappingKind.UNMAPPABLE,
                    reason=f"endpoint {endpoint.id} registered no device infos",
                    reason_code="endpoint_without_devices",
                    reason_subject=str(endpoint.id),
                )
            for device in endpoint.device_infos:
                if device.device_id.lower() == device_id or (index is not None and device.index == index):
                    hit_ranks.add(endpoint.id)
    if not hit_ranks:
        return HardwareMapping(
            MappingKind.NOT_AFFECTED,
            reason=f"no endpoint of the instance uses {fault.card!r}",
            reason_code="card_not_in_instance",
            reason_subject=fault.card,
        )
    return HardwareMapping(MappingKind.MAPPED, ranks=ranks(hit_ranks))


@dataclass(frozen=True, slots=True)
class HardwareEvent:
    """A hardware fault as the FaultManager holds it for one instance (in memory only)."""

    fault: HardwareFault
    mapping: HardwareMapping
    received_at: float
    """Monotonic seconds; the start of its correlation window when it came first (F-12)."""
