"""``heteroflow health``: run a prediction tick now, or backtest the rules on a counters trace."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import dataclasses
import json
import tempfile
from collections import defaultdict
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

import typer

from heteroflow.cli.admin import DatabaseUrl, engine_for
from heteroflow.core.ids import NodeId
from heteroflow.core.testing import FakeClock
from heteroflow.health.counters import HEALTH_KEYS, Counters
from heteroflow.health.event_replay import parse_event_rows, replay
from heteroflow.health.heartbeat import parse_index, parse_time, parse_uuid
from heteroflow.health.metrics_settings import GpuMetricsSettings
from heteroflow.health.prediction_settings import PredictionSettings
from heteroflow.health.rules import RULE_VERSION
from heteroflow.health.samples import CardKey, HealthReading
from heteroflow.health.statistics import band_statistics
from heteroflow.platform.auth import NodeScope
from heteroflow.platform_server.alert_delivery import AlertDeliverySettings, AlertNotifier
from heteroflow.platform_server.prediction_worker import PredictionWorker, rule_params
from heteroflow.storage.alert_store import SqlAlertStore
from heteroflow.storage.db import create_db_engine, upgrade_database
from heteroflow.storage.health_store import SqlHealthSampleStore
from heteroflow.storage.lease_store import SqlLeaseStore
from heteroflow.storage.metrics_store import SqlGpuMetricsStore
from heteroflow.storage.node_store import SqlNodeStore
from heteroflow.storage.prediction_store import PredictionFilter, SqlPredictionStore

app = typer.Typer(help="GPU health prediction: run a tick, backtest the rules.", no_args_is_help=True)


def _worker(
    engine: Any, *, settings: PredictionSettings, clock: Any, notifier: AlertNotifier | None
) -> PredictionWorker:
    return PredictionWorker(
        predictions=SqlPredictionStore(engine),
        alerts=SqlAlertStore(engine),
        nodes=SqlNodeStore(engine),
        leases=SqlLeaseStore(engine),
        settings=settings,
        clock=clock,
        notifier=notifier,
        # weak signals (temperature, power) from the metrics history, as the server's worker reads them
        metrics=SqlGpuMetricsStore(engine),
        weak_params=GpuMetricsSettings.load().weak,
    )


@app.command()
def tick(database_url: DatabaseUrl = None) -> None:
    """Run one worker tick now (backfill, predict, alert upkeep) and print its report as JSON.

    Safe beside a running server: predictions and judgements are idempotent in storage.
    """
    from heteroflow.core.clock import SystemClock

    engine = engine_for(database_url)

    async def run() -> dict[str, Any]:
        notifier = AlertNotifier(AlertDeliverySettings.load())
        notifier.start()
        worker = _worker(engine, settings=PredictionSettings.load(), clock=SystemClock(), notifier=notifier)
        report = await asyncio.to_thread(worker.tick)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(notifier.drained(), 15)
        await notifier.stop()
        return dataclasses.asdict(report)

    typer.echo(json.dumps(asyncio.run(run()), default=str, indent=2))


@dataclasses.dataclass
class _Trace:
    readings: list[tuple[str, HealthReading]]
    skipped: int


def _read_trace(path: Path) -> _Trace:
    """Rows of node, index, uuid, sampled_at and the five keys; an unusable row is skipped and counted."""
    readings: list[tuple[str, HealthReading]] = []
    skipped = 0
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            node = (row.get("node") or "").strip()
            index = parse_index(_number(row.get("index")))
            at = parse_time(row.get("sampled_at"))
            if not node or index is None or at is None:
                skipped += 1
                continue
            counters = Counters(**{key: _counter(row.get(key)) for key in HEALTH_KEYS})
            if counters.all_unknown:
                skipped += 1
                continue
            key = CardKey(node_id=NodeId(node), gpu_index=index, source="real")
            readings.append(
                (node, HealthReading(key=key, uuid=parse_uuid(row.get("uuid")), sampled_at=at, counters=counters))
            )
    return _Trace(readings, skipped)


def _number(text: str | None) -> int | None:
    try:
        return int((text or "").strip())
    except ValueError:
        return None


def _counter(text: str | None) -> int | None:
    value = _number(text)
    return value if value is not None and 0 <= value <= 2**63 - 1 else None


@app.command()
def backtest(
    trace: Annotated[
        Path | None,
        typer.Option(exists=True, dir_okay=False, help="CSV: node,index,uuid,sampled_at,<five keys>"),
    ] = None,
    events: Annotated[
        Path | None,
        typer.Option(
            exists=True,
            dir_okay=False,
            help="Error-event log CSV, one row per error: device,time,type (CE/UE), or the Calchas shape "
            "(Datacenter,Server,Name,...,Time,EccType)",
        ),
    ] = None,
    param: Annotated[list[str] | None, typer.Option(help="Override a rule setting, e.g. --param ratio=1.5")] = None,
    tick_minutes: Annotated[float, typer.Option(min=1, help="Simulated minutes between worker ticks")] = 60,
    step_minutes: Annotated[
        float, typer.Option(min=1, max=1440, help="--events: minutes between the replayed counter samples")
    ] = 60,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON")] = False,
) -> None:
    """Replay a counters trace through the same rules, backfill and statistics as production, or an error-event
    log (--events) as cumulative counters through the same rules.

    Prints precision, recall, missed cards and lead times per rule, so thresholds can be calibrated on your own
    history before changing them. With --events: overall and first-failure precision and recall with 95%
    intervals over devices, beside an any-correctable-error baseline at the same alert rate. An invalid --param
    falls back to the default with a warning, as in production.
    """
    if (trace is None) == (events is None):
        raise typer.BadParameter("give exactly one of --trace (a counters trace) and --events (an error-event log)")
    overrides: dict[str, str] = {}
    for item in param or []:
        name, sep, value = item.partition("=")
        if not sep or name not in PredictionSettings.model_fields:
            raise typer.BadParameter(
                f"{item!r}: use NAME=VALUE with NAME one of {', '.join(PredictionSettings.model_fields)}"
            )
        overrides[name] = value
    settings = PredictionSettings.load(**overrides, alert_enabled="false")
    for warning in settings.config_warnings:
        typer.echo(f"warning: {warning}", err=True)
    if events is not None:
        _backtest_events(events, settings, step=timedelta(minutes=step_minutes), as_json=as_json)
        return
    assert trace is not None
    loaded = _read_trace(trace)
    if not loaded.readings:
        raise typer.BadParameter(f"{trace}: no usable rows ({loaded.skipped} skipped)")
    result = _replay(loaded, settings, tick=timedelta(minutes=tick_minutes))
    if as_json:
        typer.echo(json.dumps(result, indent=2, default=str))
        return
    typer.echo(f"trace: {result['cards']} cards, {result['samples']} samples, {result['skipped_rows']} rows skipped")
    typer.echo(
        f"rules: v1-ecc-growth (experimental), window {settings.window_days} days, ticks every {tick_minutes:g} min"
    )
    band = result["band"]
    typer.echo(
        f"predictions: {band['hit']} hit, {band['miss']} miss, {band['voided']} voided, {band['pending']} pending; "
        f"failed cards {band['failed_cards']}, predicted {band['predicted_cards']}, missed {band['missed_cards']}"
    )
    typer.echo(
        f"precision {_ratio(band['precision'])}  recall {_ratio(band['recall'])}  {'; '.join(band['insufficient'])}"
    )
    typer.echo(
        f"{'rule':<24} {'predictions':>11} {'hit':>5} {'miss':>5} {'voided':>6} {'precision':>9} {'median lead h':>13}"
    )
    for rule, row in sorted(result["rules"].items()):
        lead = "-" if row["median_lead_hours"] is None else f"{row['median_lead_hours']:g}"
        typer.echo(
            f"{rule:<24} {row['predictions']:>11} {row['hit']:>5} {row['miss']:>5} {row['voided']:>6} "
            f"{_ratio(row['precision']):>9} {lead:>13}"
        )


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _backtest_events(path: Path, settings: PredictionSettings, *, step: timedelta, as_json: bool) -> None:
    with path.open(newline="", encoding="utf-8", errors="replace") as handle:
        events, skipped = parse_event_rows(csv.DictReader(handle))
    if not events:
        raise typer.BadParameter(f"{path}: no usable event rows ({skipped} skipped)")
    result = replay(
        events,
        params=rule_params(settings),
        window_days=settings.window_days,
        step=step,
        min_matured=settings.min_matured,
        min_span_days=settings.min_span_days,
    )
    document = {
        "events": len(events),
        "skipped_rows": skipped,
        "devices": result.devices,
        "failing_devices": result.failing_devices,
        "failing_devices_without_earlier_ce": result.failing_without_earlier_ce,
        "span_days": round(result.span_days, 2),
        "step_minutes": step / timedelta(minutes=1),
        "samples_per_device": result.samples_per_device,
        "rule_version": RULE_VERSION,
        "window_days": settings.window_days,
        "overall": result.overall.to_json(),
        "first_failure": result.first_failure.to_json(),
        "baseline": {
            "rule": f"at least {result.baseline_threshold} new correctable error(s) in the last "
            f"{settings.growth_window_hours:g} h (the threshold closest to the rules' alert count)",
            "threshold": result.baseline_threshold,
            "overall": result.baseline_overall.to_json(),
            "first_failure": result.baseline_first_failure.to_json(),
        },
    }
    if as_json:
        typer.echo(json.dumps(document, indent=2))
        return
    typer.echo(
        f"events: {len(events)} ({skipped} rows skipped), {result.devices} devices, {result.failing_devices} "
        f"failing ({result.failing_without_earlier_ce} without a correctable error before their first "
        f"uncorrectable one), {result.span_days:.0f} days sampled every {step / timedelta(minutes=1):g} min"
    )
    typer.echo(f"rules: {RULE_VERSION} (experimental), window {settings.window_days} days")
    for name, figures in (
        ("rules, overall", document["overall"]),
        ("rules, first failure", document["first_failure"]),
        (f"baseline k={result.baseline_threshold}, overall", document["baseline"]["overall"]),  # type: ignore[index]
        (f"baseline k={result.baseline_threshold}, first failure", document["baseline"]["first_failure"]),  # type: ignore[index]
    ):
        assert isinstance(figures, dict)
        typer.echo(
            f"{name:<32} {figures['predictions']:>5} predictions ({figures['hit']} hit, {figures['miss']} miss, "
            f"{figures['pending']} pending)  precision {_ratio(figures['precision'])} "
            f"{_interval(figures['precision_ci95'])}  recall {_ratio(figures['recall'])} "
            f"{_interval(figures['recall_ci95'])} of {figures['failed_devices']} devices"
            + (f"  [{'; '.join(figures['insufficient'])}]" if figures["insufficient"] else "")
        )


def _interval(bounds: list[float] | None) -> str:
    return "" if bounds is None else f"[{bounds[0]:.0%}-{bounds[1]:.0%}]"


def _replay(trace: _Trace, settings: PredictionSettings, *, tick: timedelta) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="hf-backtest-") as workdir:
        engine = create_db_engine(f"sqlite:///{workdir}/backtest.db")
        upgrade_database(engine)
        first = min(r.sampled_at for _, r in trace.readings)
        last = max(r.sampled_at for _, r in trace.readings)
        nodes = SqlNodeStore(engine)
        ids: dict[str, NodeId] = {}
        for name in sorted({name for name, _ in trace.readings}):
            node_record = nodes.register(
                name=f"bt-{len(ids):05d}",
                vendor="trace",
                model=name[:200],
                gpu_count=0,
                source="real",
                tenant_id=None,
                now=first,
            ).node
            ids[name] = node_record.id
        rows = [
            r._replace(key=CardKey(node_id=ids[name], gpu_index=r.key.gpu_index, source="real"))
            for name, r in trace.readings
        ]
        samples = SqlHealthSampleStore(engine)
        for start in range(0, len(rows), 5000):
            samples.insert(rows[start : start + 5000])
        clock = FakeClock(first)
        worker = _worker(engine, settings=settings, clock=clock, notifier=None)
        end = last + timedelta(days=settings.window_days) + tick
        while clock.now() <= end:
            worker.tick()
            clock.advance(tick.total_seconds())
        predictions = SqlPredictionStore(engine)
        scope = NodeScope(tenant_id=None)
        since = first - timedelta(seconds=1)
        bands, exposure = predictions.statistics(
            source="real", scope=scope, since=since, now=clock.now(), window_days=[settings.window_days]
        )
        counts = bands[settings.window_days]
        stats = band_statistics(
            counts, exposure, min_matured=settings.min_matured, min_span_days=settings.min_span_days
        )
        records, _ = predictions.list(PredictionFilter(source="real", scope=scope), limit=1_000_000, offset=0)
        engine.dispose()
    per_rule: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"predictions": 0, "hit": 0, "miss": 0, "voided": 0, "leads": []}
    )
    for record in records:
        for code in record.signals:
            row = per_rule[code]
            row["predictions"] += 1
            if record.status in ("hit", "miss", "voided"):
                row[record.status] += 1
            if record.failure_at is not None:
                row["leads"].append((record.failure_at - record.t0) / timedelta(hours=1))
    rules = {}
    for code, row in per_rule.items():
        leads = sorted(row.pop("leads"))
        matured = row["hit"] + row["miss"]
        rules[code] = {
            **row,
            "precision": row["hit"] / matured if matured else None,
            "median_lead_hours": round(leads[len(leads) // 2], 1) if leads else None,
        }
    return {
        "cards": exposure.monitorable_cards,
        "samples": len(trace.readings),
        "skipped_rows": trace.skipped,
        "span_days": exposure.span_days,
        "band": {
            **dataclasses.asdict(stats.counts),
            "missed_cards": stats.missed_cards,
            "precision": stats.precision,
            "recall": stats.recall,
            "insufficient": list(stats.insufficient),
        },
        "rules": rules,
    }
