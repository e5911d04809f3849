"""The controller's Prometheus metrics (F-60): phase per instance, rounds by outcome, stage latencies."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from heteroflow.serving.controller.core.phase import FtPhase

STAGE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class ControllerMetrics:
    """One registry per controller, so that tests and several controllers in a process never share series."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.phase = Gauge(
            "heteroflow_controller_ft_phase",
            "1 for the instance's current fault-tolerance phase, 0 for the others.",
            ["instance_id", "phase"],
            registry=self.registry,
        )
        self.rounds = Counter(
            "heteroflow_controller_rounds",
            "Strategies run, by kind (scale_down, fast_recovery, fallback) and outcome.",
            ["kind", "outcome"],
            registry=self.registry,
        )
        self.stage_seconds = Histogram(
            "heteroflow_controller_stage_seconds",
            "Seconds spent in each stage of a round (guard, apply_ready, apply, recovered, probe, commit, "
            "publish, round_total) and in fallbacks.",
            ["stage"],
            buckets=STAGE_BUCKETS,
            registry=self.registry,
        )
        self.dispatch_seconds = Histogram(
            "heteroflow_controller_apply_dispatch_seconds",
            "A round's apply dispatch: 'last' = from the first send to the last NodeManager's acknowledgement (every "
            "survivor had its command by then; vLLM 0.34 needs it within 10 s), 'spread' = first to last "
            "acknowledgement.",
            ["measure"],
            buckets=STAGE_BUCKETS,
            registry=self.registry,
        )
        self.store_errors = Counter(
            "heteroflow_controller_store_errors",
            "FtRuntimeStore writes that failed (unavailable or conflicting).",
            registry=self.registry,
        )
        self.reports = Counter(
            "heteroflow_controller_fault_reports",
            "Software fault reports received, by evidence.",
            ["evidence"],
            registry=self.registry,
        )

        self.hardware_faults = Counter(
            "heteroflow_controller_hardware_faults",
            "Hardware faults taken for an instance, by source and mapping (MAPPED, UNMAPPABLE).",
            ["source", "mapping"],
            registry=self.registry,
        )
        self.intervention_required = Gauge(
            "heteroflow_controller_intervention_required",
            "1 while an instance's whole-instance relaunches used up fallback_max_attempts within "
            "fallback_attempt_window_sec and the controller stopped retrying (INTERVENTION_REQUIRED).",
            ["instance_id"],
            registry=self.registry,
        )
        self.relaunch_refused = Gauge(
            "heteroflow_controller_relaunch_refused",
            "1 while a fallback refuses to relaunch an instance because ranks would run on cards with a standing "
            "hardware fault and the instance cannot run without them (RELAUNCH_REFUSED).",
            ["instance_id"],
            registry=self.registry,
        )
        self.acting = Gauge(
            "heteroflow_controller_acting",
            "1 while this controller acts (the leader in active/standby mode, or a started single controller).",
            registry=self.registry,
        )

    def set_phase(self, instance_id: str, phase: FtPhase) -> None:
        for candidate in FtPhase:
            self.phase.labels(instance_id=instance_id, phase=candidate.value).set(1 if candidate == phase else 0)
        # present (0) from the instance's first phase on, so that its absence never reads as "no intervention"
        self.intervention_required.labels(instance_id=instance_id)
        self.relaunch_refused.labels(instance_id=instance_id)

    def render(self) -> bytes:
        return generate_latest(self.registry)
