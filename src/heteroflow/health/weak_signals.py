"""Weak signals from the GPU metrics history: temperature and power anomalies. Purely computational.

Weak signals are supporting evidence on a prediction that a strong or trend signal triggered; the rules' gate
(:func:`heteroflow.health.rules.evaluate`) makes sure they can never trigger one alone. Heat and unusual power
draw are plausible companions of degrading memory, but they are just as often the job's or the datacentre's
business, so they are never read as a fault by themselves.

Only minutes of the same card (same uuid, H-4) in the window count; a metric unknown in a minute is left out,
never read as 0, and too few known minutes means no signal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from heteroflow.health.gpu_metrics import MinuteRow
from heteroflow.health.rules import Signal


@dataclass(frozen=True, slots=True)
class WeakSignalParams:
    recent: timedelta = timedelta(hours=24)
    """The recent period that is compared with the rest of the history."""
    history: timedelta = timedelta(days=7)
    """How far back the history reaches (the metrics retention bounds it)."""
    temperature_c: float = 90.0
    """A minute whose max temperature reaches this counts as hot."""
    hot_minutes: int = 30
    """Hot minutes in the recent period that make a temperature signal."""
    power_ratio: float = 0.3
    """Relative change of the mean power draw at high utilisation, recent vs. earlier, that makes a power signal."""
    busy_utilization_pct: float = 80.0
    """Minutes at or above this mean utilisation are compared (power follows load; idle minutes say nothing)."""
    min_minutes: int = 60
    """Known minutes each side of the power comparison needs."""


def weak_signals(
    rows: Sequence[MinuteRow], *, uuid: str | None, t0: datetime, params: WeakSignalParams
) -> list[Signal]:
    """The weak signals of one card at ``t0`` from its minute rows (any order; other uuids are ignored)."""
    recent_start = t0 - params.recent
    history_start = t0 - params.history
    own = [r for r in rows if r.uuid == uuid and history_start <= r.minute <= t0]
    recent = [r for r in own if r.minute >= recent_start]
    earlier = [r for r in own if r.minute < recent_start]
    signals: list[Signal] = []

    hot = [r for r in recent if (t := r.values.get("temperature_c")) is not None and t.max >= params.temperature_c]
    if len(hot) >= params.hot_minutes:
        peak = max(t.max for r in hot if (t := r.values.get("temperature_c")) is not None)
        signals.append(
            Signal(
                "weak",
                "temperature_high",
                f"{len(hot)} minutes at or above {params.temperature_c:g} °C in the last "
                f"{params.recent / timedelta(hours=1):g}h (peak {peak:g} °C)",
            )
        )

    recent_power = _busy_power(recent, params)
    earlier_power = _busy_power(earlier, params)
    if recent_power is not None and earlier_power is not None and earlier_power > 0:
        change = (recent_power - earlier_power) / earlier_power
        if abs(change) >= params.power_ratio:
            signals.append(
                Signal(
                    "weak",
                    "power_shift",
                    f"mean power at >= {params.busy_utilization_pct:g}% utilisation {recent_power:.0f} W in the last "
                    f"{params.recent / timedelta(hours=1):g}h vs {earlier_power:.0f} W before ({change:+.0%})",
                )
            )
    return signals


def _busy_power(rows: Sequence[MinuteRow], params: WeakSignalParams) -> float | None:
    total = 0.0
    count = 0
    for row in rows:
        util = row.values.get("utilization_pct")
        power = row.values.get("power_w")
        if util is None or power is None or util.avg < params.busy_utilization_pct:
            continue
        total += power.avg * power.count
        count += power.count
    minutes = sum(
        1
        for r in rows
        if (u := r.values.get("utilization_pct")) is not None
        and u.avg >= params.busy_utilization_pct
        and r.values.get("power_w") is not None
    )
    if minutes < params.min_minutes or not count:
        return None
    return total / count
