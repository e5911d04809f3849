"""``heteroflow sim``: simulated health data for demonstrations, isolated from real data (H-70)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Annotated

import typer

from heteroflow.cli.admin import DatabaseUrl, engine_for
from heteroflow.core.clock import SystemClock
from heteroflow.core.ids import NodeId
from heteroflow.health.samples import CardKey, HealthReading
from heteroflow.health.simulation import PROFILES, Profile, series
from heteroflow.storage.health_store import SqlHealthSampleStore, purge_simulated
from heteroflow.storage.node_store import SqlNodeStore

app = typer.Typer(help="Simulated health data (source 'simulated': never in real statistics or alerts).")
GPUS_PER_NODE = 8


@app.command()
def generate(
    profile: Annotated[str, typer.Option(help=f"One of: {', '.join(PROFILES)}")],
    cards: Annotated[int, typer.Option(min=1, max=10_000, help="Simulated cards (8 per simulated node)")] = 8,
    days: Annotated[float, typer.Option(min=0.1, max=180, help="Days of samples, ending now")] = 14,
    database_url: DatabaseUrl = None,
) -> None:
    """Write simulated samples every 5 minutes for ``cards`` cards over ``days`` days, ending now."""
    if profile not in PROFILES:
        raise typer.BadParameter(
            f"unknown profile {profile!r}; choose one of {', '.join(PROFILES)}", param_hint="--profile"
        )
    chosen: Profile = next(p for p in PROFILES if p == profile)
    engine = engine_for(database_url)
    nodes, samples = SqlNodeStore(engine), SqlHealthSampleStore(engine)
    now = SystemClock().now()
    start = now - timedelta(days=days)
    written = 0
    for first in range(0, cards, GPUS_PER_NODE):
        count = min(GPUS_PER_NODE, cards - first)
        node = nodes.register(
            name=f"sim-{chosen}-{first // GPUS_PER_NODE:03d}",
            vendor="nvidia",
            model="simulated",
            gpu_count=count,
            source="simulated",
            tenant_id=None,
            now=now,
        ).node
        batch: list[HealthReading] = []
        for index in range(count):
            key = CardKey(node_id=NodeId(node.id), gpu_index=index, source="simulated")
            for sample in series(chosen, card=first + index, start=start, end=now):
                batch.append(
                    HealthReading(key=key, uuid=sample.uuid, sampled_at=sample.sampled_at, counters=sample.counters)
                )
                if len(batch) >= 5000:
                    written += len(samples.insert(batch))
                    batch = []
        written += len(samples.insert(batch))
    typer.echo(json.dumps({"profile": chosen, "cards": cards, "days": days, "samples_written": written}))


@app.command()
def purge(database_url: DatabaseUrl = None) -> None:
    """Delete every simulated row (samples, predictions, XID events, simulated nodes); real rows are untouched."""
    typer.echo(json.dumps(purge_simulated(engine_for(database_url))))
