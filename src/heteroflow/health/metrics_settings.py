"""Settings of the GPU metrics history and GPU_MEMORY_HIGH: invalid values fall back to the default."""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field

from heteroflow.core.settings import LenientSettings, env_names
from heteroflow.health.gpu_metrics import MemoryHighParams
from heteroflow.health.weak_signals import WeakSignalParams


class GpuMetricsSettings(LenientSettings):
    """How the heartbeat's GPU metrics are aggregated, stored, expired and alerted on."""

    retention_days: int = Field(
        default=7,
        gt=0,
        le=3650,
        validation_alias=env_names("gpu_metrics_retention_days", "GPU_METRICS_RETENTION_DAYS"),
        description=(
            "Days a per-minute metrics row is kept (default 7). Non-numeric or <= 0 falls back to 7 with a "
            "warning: a typo must never empty the table."
        ),
    )
    flush_seconds: float = Field(
        default=15.0,
        gt=0,
        le=3600,
        validation_alias=env_names("gpu_metrics_flush_seconds"),
        description=(
            "Seconds between two flushes of the closed minutes to the database (default 15), each written in "
            "slices (flush_slice_rows, flush_spread_seconds). "
            "GPU_MEMORY_HIGH is decided at the same pace."
        ),
    )
    flush_slice_rows: int = Field(
        default=250,
        ge=1,
        le=100_000,
        validation_alias=env_names("gpu_metrics_flush_slice_rows"),
        description=(
            "Closed minute rows built and written per transaction of a flush (default 250): a fleet's minute is "
            "written a slice at a time, each a few milliseconds of the server's CPU."
        ),
    )
    flush_spread_seconds: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        validation_alias=env_names("gpu_metrics_flush_spread_seconds"),
        description=(
            "Seconds over which the background flush spreads its slices (default 30, well within the minute): "
            "the heartbeats are not queued behind one long burst of work. 0 writes them back to back; the final "
            "flush at shutdown never pauses."
        ),
    )
    cleanup_interval_seconds: float = Field(
        default=3600.0,
        gt=0,
        validation_alias=env_names("gpu_metrics_cleanup_interval_seconds"),
        description="Seconds between two retention cleanups, run only after rows were written (default 3600).",
    )
    cleanup_timeout_seconds: float = Field(
        default=60.0,
        gt=0,
        validation_alias=env_names("gpu_metrics_cleanup_timeout_seconds"),
        description="Time limit of one retention cleanup (default 60 s).",
    )
    max_pending_rows: int = Field(
        default=200_000,
        ge=1,
        validation_alias=env_names("gpu_metrics_max_pending_rows"),
        description=(
            "Closed minute rows kept in memory while the database is unavailable (default 200000, about 17 "
            "hours of 200 cards). Beyond it the oldest rows are dropped and counted."
        ),
    )
    export_stale_seconds: float = Field(
        default=300.0,
        gt=0,
        validation_alias=env_names("gpu_metrics_export_stale_seconds"),
        description=(
            "A card not heard of for this long (default 300 s) has no series on /metrics: a value that stopped "
            "arriving is unknown, not frozen at its last reading."
        ),
    )
    memory_high_share: float = Field(
        default=0.95,
        gt=0,
        le=1,
        validation_alias=env_names("gpu_memory_high_share", "GPU_MEMORY_HIGH_SHARE"),
        description="Share of memory used (0..1, default 0.95) above which a card counts as full.",
    )
    memory_high_minutes: float = Field(
        default=10.0,
        gt=0,
        le=10_080,
        validation_alias=env_names("gpu_memory_high_minutes", "GPU_MEMORY_HIGH_MINUTES"),
        description=(
            "Minutes a card must stay above the share before GPU_MEMORY_HIGH is raised for its node (default 10)."
        ),
    )
    memory_high_alerts: bool = Field(
        default=True,
        validation_alias=env_names("gpu_memory_high_alerts", "GPU_MEMORY_HIGH_ALERTS"),
        description="GPU_MEMORY_HIGH alerts on (default). Only an explicit false turns them off (fail-open).",
    )

    weak_temperature_c: float = Field(
        default=90.0,
        gt=0,
        le=200,
        validation_alias=env_names("gpu_weak_temperature_c", "GPU_WEAK_TEMPERATURE_C"),
        description=(
            "Weak signal: a minute at or above this temperature (default 90 °C) counts as hot. Weak signals are "
            "evidence on a prediction a strong or trend signal made; they never make one alone."
        ),
    )
    weak_hot_minutes: int = Field(
        default=30,
        ge=1,
        le=1440,
        validation_alias=env_names("gpu_weak_hot_minutes", "GPU_WEAK_HOT_MINUTES"),
        description="Weak signal: hot minutes in the last 24 h that make a temperature signal (default 30).",
    )
    weak_power_ratio: float = Field(
        default=0.3,
        gt=0,
        validation_alias=env_names("gpu_weak_power_ratio", "GPU_WEAK_POWER_RATIO"),
        description=(
            "Weak signal: relative change of the mean power draw at >= 80% utilisation, last 24 h vs the rest of "
            "the retained history, that makes a power signal (default 0.3)."
        ),
    )

    @property
    def weak(self) -> WeakSignalParams:
        return WeakSignalParams(
            history=timedelta(days=self.retention_days),
            temperature_c=self.weak_temperature_c,
            hot_minutes=self.weak_hot_minutes,
            power_ratio=self.weak_power_ratio,
        )

    @property
    def memory_high(self) -> MemoryHighParams:
        return MemoryHighParams(share=self.memory_high_share, duration=timedelta(minutes=self.memory_high_minutes))
