"""Settings of the prediction engine (H-32): every parameter an env var, invalid → default + warning.

The thresholds are initial values from the public mechanism ("corrected-ECC growth accelerates before
uncorrectable errors appear"), not fitted to this platform's history, which did not exist. They are
configurable so they can be calibrated on real data (``heteroflow health backtest``), not so that a demo
looks good.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field

from heteroflow.core.settings import LenientSettings, env_names


def _whole_number(value: object) -> object:
    """An environment variable or ``--param`` is text: ``"30"`` is the number 30, which a literal does not coerce."""
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return value


class PredictionSettings(LenientSettings):
    """Rules v1-ecc-growth, the worker, the statistics gates and the alert switch."""

    enabled: bool = Field(
        default=True,
        validation_alias=env_names("gpu_fault_predict_enabled", "GPU_FAULT_PREDICT_ENABLED"),
        description="The prediction worker runs (default true).",
    )
    tick_minutes: float = Field(
        default=30.0,
        gt=0,
        validation_alias=env_names("gpu_fault_predict_tick_minutes", "GPU_FAULT_PREDICT_TICK_MINUTES"),
        description="Minutes between worker ticks (default 30). Each tick backfills, then predicts.",
    )
    window_days: Annotated[Literal[7, 30], BeforeValidator(_whole_number)] = Field(
        default=7,
        validation_alias=env_names("gpu_fault_predict_window_days", "GPU_FAULT_PREDICT_WINDOW_DAYS"),
        description="Hit window of new predictions, 7 (default) or 30 days; frozen into each prediction.",
    )
    growth_window_hours: float = Field(
        default=24.0,
        gt=0,
        validation_alias=env_names("gpu_fault_predict_growth_window_hours", "GPU_FAULT_PREDICT_GROWTH_WINDOW_HOURS"),
        description="Length of one corrected-ECC growth window, hours (default 24).",
    )
    consecutive_windows: int = Field(
        default=3,
        ge=2,
        le=14,
        validation_alias=env_names("gpu_fault_predict_consecutive_windows", "GPU_FAULT_PREDICT_CONSECUTIVE_WINDOWS"),
        description=(
            "Consecutive growth windows whose increases must strictly increase (default 3): separates sustained "
            "acceleration from a one-off burst."
        ),
    )
    ce_flood_per_second: float = Field(
        default=10.0,
        gt=0,
        validation_alias=env_names("gpu_fault_predict_ce_flood_per_second", "GPU_FAULT_PREDICT_CE_FLOOD_PER_SECOND"),
        description=(
            "Corrected-ECC rate, per second over the last growth window, flagged as a flood (default 10): weak "
            "evidence on a prediction, never a prediction by itself."
        ),
    )
    baseline_days: float = Field(
        default=7.0,
        gt=0,
        validation_alias=env_names("gpu_fault_predict_baseline_days", "GPU_FAULT_PREDICT_BASELINE_DAYS"),
        description="Baseline of the daily mean, days (default 7; it includes the last growth window).",
    )
    ratio: float = Field(
        default=1.2,
        gt=0,
        validation_alias=env_names("gpu_fault_predict_ratio", "GPU_FAULT_PREDICT_RATIO"),
        description=(
            "The last window's increase must be at least this times the baseline daily mean (default 1.2). The "
            "ratio is bounded by [0, baseline days]; gradual degradation gives 1.2-1.4, so 3 would never fire."
        ),
    )
    min_increase: int = Field(
        default=32,
        ge=1,
        validation_alias=env_names("gpu_fault_predict_min_increase", "GPU_FAULT_PREDICT_MIN_INCREASE"),
        description="Minimum corrected-ECC increase in the last window (default 32): small numbers make big ratios.",
    )
    observation_days: float = Field(
        default=7.0,
        gt=0,
        validation_alias=env_names("gpu_fault_predict_observation_days", "GPU_FAULT_PREDICT_OBSERVATION_DAYS"),
        description="Observation period for pending-remap and retired-page growth, days (default = baseline, 7).",
    )
    boundary_staleness_minutes: float = Field(
        default=60.0,
        gt=0,
        validation_alias=env_names("gpu_fault_predict_boundary_staleness_minutes"),
        description=(
            "A boundary value is the newest sample at or before the boundary and no older than this (default 60 "
            "min, the stall threshold); an older one would be a made-up value, so the signal is abandoned."
        ),
    )
    min_matured: int = Field(
        default=20,
        ge=1,
        validation_alias=env_names("gpu_fault_predict_min_matured", "GPU_FAULT_PREDICT_MIN_MATURED"),
        description="Matured predictions (hit + miss) below which ratios are null (default 20).",
    )
    min_span_days: float = Field(
        default=8.0,
        gt=0,
        validation_alias=env_names("gpu_fault_predict_min_span_days", "GPU_FAULT_PREDICT_MIN_SPAN_DAYS"),
        description="Observation span in days below which ratios are null (default 8).",
    )
    lease_seconds: float = Field(
        default=90.0,
        gt=0,
        validation_alias=env_names("gpu_fault_predict_lease_seconds"),
        description=(
            "Leader lease of the worker (default 90 s): a killed leader is replaced after at most this long; "
            "renewed every third of it."
        ),
    )
    alert_enabled: bool = Field(
        default=True,
        validation_alias=env_names("gpu_fault_predicted_alert_enabled", "GPU_FAULT_PREDICTED_ALERT_ENABLED"),
        description=(
            "Raise GPU_FAULT_PREDICTED for new real predictions. Absent or unreadable means on (fail-open); only "
            "an explicit false disables it."
        ),
    )
    backlog_hours: float = Field(
        default=72.0,
        gt=0,
        validation_alias=env_names("alert_backlog_hours", "ALERT_BACKLOG_HOURS"),
        description="Open alerts older than this are flagged as operations backlog (default 72 h, no exemption).",
    )
