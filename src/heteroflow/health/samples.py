"""Health samples: what a heartbeat offers and what the store keeps."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from heteroflow.core.ids import SOURCES, NodeId, Source
from heteroflow.health.counters import Counters
from heteroflow.health.sample_times import TimeFix

__all__ = ["SOURCES", "Card", "CardKey", "HealthReading", "Source", "StoredSample"]


class CardKey(NamedTuple):
    """A card slot of one node and one data source: (node, declared physical index, source).

    The index is the one the stat declares, never its position in the heartbeat array (H-14). The uuid is
    not part of the key: a slot whose uuid changes gets a new row so that an old card's counters never
    continue on the new card's timeline (H-21, H-4).

    A named tuple, not a frozen dataclass: every beat builds one key per card and looks each up about five
    times (dedup cache, pending writes, the metrics' cards and minute buckets); a tuple is built and hashed in
    C, where the dataclass ran Python for each (about a tenth of a steady beat's CPU).
    """

    node_id: NodeId
    gpu_index: int
    source: Source


class HealthReading(NamedTuple):
    """The counters of one card as one heartbeat reported them.

    A named tuple, as :class:`CardKey`: every beat builds one per card, in C (``tuple.__new__(HealthReading,
    (...))``); changed copies are made with ``_replace``."""

    key: CardKey
    uuid: str | None
    sampled_at: datetime
    counters: Counters
    time_fix: TimeFix | None = None
    """Why ``sampled_at`` is not the time the agent claimed (``sample_times.py``); ``None`` when it is."""
    semantics_unconfirmed: tuple[str, ...] = ()
    """Keys whose meaning the vendor has not confirmed (cnmon ``Ecc-Error``), as the agent marked them."""


@dataclass(frozen=True, slots=True)
class StoredSample:
    """A row of ``gpu_health_samples`` as the store reported it (times as read back)."""

    key: CardKey
    uuid: str | None
    sampled_at: datetime
    counters: Counters
    semantics_unconfirmed: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Card:
    """ "The same card" everywhere in rules, backfill and statistics (H-4): node, physical index, uuid, source.

    A value read under another uuid belongs to another card and is unknown for this one.
    """

    node_id: NodeId
    gpu_index: int
    uuid: str | None
    source: Source

    @property
    def slot(self) -> CardKey:
        return CardKey(node_id=self.node_id, gpu_index=self.gpu_index, source=self.source)
