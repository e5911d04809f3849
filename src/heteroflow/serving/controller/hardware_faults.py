"""One hardware fault mapped onto every assembled instance and kept where it matters (``serving-ft.md`` F-3, F-12).

Besides the evidence (reset by a committed round or a rebuild), a mapped L5-L6 fault is kept as *standing*
(``Instance.standing``) until its source clears it: a fallback never relaunches a rank on its card
(``core/relaunch.py``)."""

from __future__ import annotations

from collections.abc import Iterable

import structlog

from heteroflow.contracts.serving import HardwareFaultReport
from heteroflow.serving.controller.core.normalizer import (
    HardwareEvent,
    HardwareFault,
    HardwareMapping,
    MappingKind,
    map_hardware_fault,
)
from heteroflow.serving.controller.core.relaunch import is_standing
from heteroflow.serving.controller.history import RoundHistory
from heteroflow.serving.controller.instance import Instance
from heteroflow.serving.controller.metrics import ControllerMetrics

_log = structlog.get_logger(__name__)


def record_hardware_fault(
    instances: Iterable[Instance],
    report: HardwareFaultReport,
    *,
    now: float,
    metrics: ControllerMetrics,
    history: RoundHistory,
) -> dict[str, HardwareMapping]:
    """Map ``report`` onto each instance; a cleared fault is forgotten (the standing one too). Returns the mapping
    per instance (none for a cleared fault)."""
    fault = HardwareFault(
        node_name=report.node_name, card=report.card, fault_code=report.fault_code, level=report.level
    )
    results: dict[str, HardwareMapping] = {}
    for inst in instances:
        if report.cleared:
            inst.evidence.hardware_seen.pop(fault.key, None)
            inst.evidence.hardware = [e for e in inst.evidence.hardware if e.fault.key != fault.key]
            if inst.standing.faults.pop(fault.key, None) is not None:
                history.add(None, "standing_fault_cleared", key=fault.key, source=report.source)
            continue
        mapping = map_hardware_fault(fault, inst.topology)
        results[inst.instance_id] = mapping
        if mapping.kind == MappingKind.MAPPED and is_standing(fault):
            inst.standing.faults[fault.key] = fault  # a repeat refreshes nothing else: the card is still faulty
        if mapping.kind == MappingKind.NOT_AFFECTED or fault.key in inst.evidence.hardware_seen:
            continue
        inst.evidence.hardware_seen[fault.key] = {
            "key": fault.key,
            "level": fault.level,
            "source": report.source,
            "mapping": mapping.kind.value,
            "ranks": sorted(mapping.ranks),
            "reason": mapping.reason,
            "reason_code": mapping.reason_code or None,
            "reason_subject": mapping.reason_subject or None,
        }
        inst.evidence.hardware.append(HardwareEvent(fault=fault, mapping=mapping, received_at=now))
        metrics.hardware_faults.labels(source=report.source, mapping=mapping.kind.value).inc()
        history.add(
            inst.runtime.request_id if inst.strategy.running else None,
            "hardware_fault",
            key=fault.key,
            level=fault.level,
            mapping=mapping.kind.value,
            ranks=sorted(mapping.ranks),
            source=report.source,
        )
        _log.info(
            "controller.hardware_fault",
            instance_id=inst.instance_id,
            key=fault.key,
            level=fault.level,
            mapping=mapping.kind.value,
            ranks=sorted(mapping.ranks),
            reason=mapping.reason,
            source=report.source,
        )
    return results
