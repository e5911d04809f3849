"""Settings of the GPU health subsystem (H-24, H-25): invalid values fall back to the default."""

from __future__ import annotations

import functools
from datetime import timedelta

from pydantic import Field

from heteroflow.core.settings import LenientSettings, env_names
from heteroflow.health.sample_times import SampleTimeWindow


class HealthStorageSettings(LenientSettings):
    """How health samples are stored, deduplicated and expired."""

    retention_days: int = Field(
        default=180,
        gt=0,
        le=36500,
        validation_alias=env_names("gpu_health_retention_days", "GPU_HEALTH_RETENTION_DAYS"),
        description=(
            "Days a health sample is kept (default 180: a 30-day window plus a 7-day baseline, with room to "
            "look back at old predictions). Non-numeric or <= 0 falls back to 180 with a warning: a typo "
            "must never empty the table."
        ),
    )
    keepalive_seconds: float = Field(
        default=300.0,
        gt=0,
        validation_alias=env_names("gpu_health_keepalive_seconds", "GPU_HEALTH_KEEPALIVE_SECONDS"),
        description=(
            "Seconds after which an unchanged card still gets a row (default 300 = 5 min, at most 288 rows "
            "per card per day), measured from the stored row's time."
        ),
    )
    dedup_cache_entries: int = Field(
        default=4096,
        ge=1,
        validation_alias=env_names("gpu_health_dedup_cache_entries", "GPU_HEALTH_DEDUP_CACHE_ENTRIES"),
        description=(
            "Cards the dedup cache remembers (default 4096 = 512 nodes x 8 cards). Size it to the cards one "
            "server sees (nodes x GPUs, e.g. 24576 for 3,000 8-GPU nodes; ~0.5 KiB each): a smaller cache "
            "costs a SELECT per beat for the cards it cannot hold (see the capacity-evictions metric)."
        ),
    )
    dedup_idle_seconds: float = Field(
        default=1800.0,
        gt=0,
        validation_alias=env_names("gpu_health_dedup_idle_seconds", "GPU_HEALTH_DEDUP_IDLE_SECONDS"),
        description="Seconds after which an unused dedup cache entry is dropped (default 1800 = 30 min).",
    )
    cleanup_every_writes: int = Field(
        default=5000,
        ge=1,
        validation_alias=env_names("gpu_health_cleanup_every_writes", "GPU_HEALTH_CLEANUP_EVERY_WRITES"),
        description=(
            "Retention cleanup runs once per this many written rows (default 5000), so a deployment that "
            "writes no health samples never runs the DELETE."
        ),
    )
    cleanup_timeout_seconds: float = Field(
        default=60.0,
        gt=0,
        validation_alias=env_names("gpu_health_cleanup_timeout_seconds", "GPU_HEALTH_CLEANUP_TIMEOUT_SECONDS"),
        description="Time limit of one retention cleanup, in its own task (default 60 s).",
    )
    max_pending_readings: int = Field(
        default=100_000,
        ge=1,
        validation_alias=env_names("gpu_health_max_pending_readings"),
        description=(
            "Readings waiting for the writer, across all cards, while the database is slow or down (default "
            "100000). Beyond it the newest reading is dropped and counted; the agent re-sends the same "
            "counters on its next beat, so nothing that still matters is lost when the database returns."
        ),
    )
    write_batch_size: int = Field(
        default=500,
        ge=1,
        validation_alias=env_names("gpu_health_write_batch_size"),
        description="Readings the writer decides and inserts in one transaction (default 500).",
    )
    stall_threshold_minutes: int = Field(
        default=60,
        gt=0,
        validation_alias=env_names("gpu_health_stall_threshold_minutes", "GPU_HEALTH_STALL_THRESHOLD_MINUTES"),
        description=(
            "Minutes without any sample (keepalive rows included) after which a card's collection is "
            "reported stalled (default 60)."
        ),
    )
    clock_skew_seconds: float = Field(
        default=300.0,
        gt=0,
        le=86400,
        validation_alias=env_names("gpu_health_clock_skew_seconds", "GPU_HEALTH_CLOCK_SKEW_SECONDS"),
        description=(
            "Seconds an agent's sample time (health `sampled_at`, telemetry `telemetry_at`, XID `occurred_at`) "
            "may be ahead of the server's clock (default 300). A later time is a wrong agent clock: the reading "
            "is kept under the server's receive time and counted "
            '(heteroflow_sample_times_corrected{reason="ahead"}), so a skewed agent can neither suppress '
            "keepalive rows and the stall badge nor open minutes that never close."
        ),
    )
    max_sample_age_seconds: float = Field(
        default=900.0,
        gt=0,
        le=86400,
        validation_alias=env_names("gpu_health_max_sample_age_seconds", "GPU_HEALTH_MAX_SAMPLE_AGE_SECONDS"),
        description=(
            "Seconds a reading's time may lie before the server's receive time (default 900). The agent "
            "reports no health reading older than three collection periods (180 s at the default 60 s), so an "
            "older time is a wrong agent clock: the reading is kept under the receive time and counted "
            '(reason="behind"). XID events are exempt (an agent keeps them while the server is down); one '
            "older than the retention is rejected."
        ),
    )

    def sample_time_window(self) -> SampleTimeWindow:
        """The claimed times the server believes (``sample_times.py``); one object per distinct setting, not one
        per beat."""
        return _window(self.clock_skew_seconds, self.max_sample_age_seconds, self.retention_days)


@functools.lru_cache(maxsize=16)
def _window(ahead_seconds: float, behind_seconds: float, retention_days: int) -> SampleTimeWindow:
    return SampleTimeWindow(
        max_ahead=timedelta(seconds=ahead_seconds),
        max_behind=timedelta(seconds=behind_seconds),
        max_event_age=timedelta(days=retention_days),
    )
