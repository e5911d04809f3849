"""The write side of sample storage, as the ingestion path needs it.

Two implementations: :class:`heteroflow.storage.health_store.SqlHealthSampleStore` (SQLite, PostgreSQL)
and :class:`heteroflow.health.testing.InMemoryHealthSampleStore`. One contract suite runs against all.
Methods are blocking; the async shell calls them from a worker thread.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Protocol

from heteroflow.core.errors import StoreUnavailableError
from heteroflow.health.samples import CardKey, HealthReading, StoredSample

__all__ = ["HealthSampleStore", "StoreUnavailableError"]


class HealthSampleStore(Protocol):
    def latest(self, key: CardKey, *, not_after: datetime | None = None) -> StoredSample | None:
        """The newest stored row of a card slot (by sampled_at) not after ``not_after``, or ``None``. One SELECT."""
        ...

    def latest_many(
        self, keys: Sequence[CardKey], *, not_after: datetime | None = None
    ) -> dict[CardKey, StoredSample | None]:
        """:meth:`latest` of every slot in ``keys`` (each key present in the answer), in as few statements as
        the store can."""
        ...

    def insert(
        self, readings: Sequence[HealthReading], *, previous: Mapping[CardKey, StoredSample | None] | None = None
    ) -> list[StoredSample]:
        """Insert all readings in one transaction; return the rows as read back.

        ``previous``: the newest stored row of each slot before the batch, when the caller knows it.
        """
        ...

    def delete_older_than(self, cutoff: datetime, *, timeout_sec: float) -> int:
        """Delete rows sampled before ``cutoff``; return how many. Bounded by ``timeout_sec``."""
        ...
