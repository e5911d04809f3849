"""An in-memory :class:`~heteroflow.health.store.HealthSampleStore`, for tests and demos."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from datetime import datetime

from heteroflow.health.samples import CardKey, HealthReading, StoredSample
from heteroflow.health.store import StoreUnavailableError


class InMemoryHealthSampleStore:
    """Keeps rows in a list; ``available = False`` makes every call fail like a lost database."""

    def __init__(self) -> None:
        self.rows: list[StoredSample] = []
        self.available = True
        self.statements = 0
        self._lock = threading.Lock()

    def _check(self) -> None:
        self.statements += 1
        if not self.available:
            raise StoreUnavailableError("in-memory store marked unavailable")

    def latest(self, key: CardKey, *, not_after: datetime | None = None) -> StoredSample | None:
        with self._lock:
            self._check()
            rows = [row for row in self.rows if row.key == key and (not_after is None or row.sampled_at <= not_after)]
            return max(rows, key=lambda row: row.sampled_at) if rows else None

    def latest_many(
        self, keys: Sequence[CardKey], *, not_after: datetime | None = None
    ) -> dict[CardKey, StoredSample | None]:
        return {key: self.latest(key, not_after=not_after) for key in keys}  # a statement each, as before

    def insert(
        self, readings: Sequence[HealthReading], *, previous: Mapping[CardKey, StoredSample | None] | None = None
    ) -> list[StoredSample]:
        with self._lock:
            self._check()
            stored = [
                StoredSample(
                    key=r.key,
                    uuid=r.uuid,
                    sampled_at=r.sampled_at,
                    counters=r.counters,
                    semantics_unconfirmed=r.semantics_unconfirmed,
                )
                for r in readings
            ]
            self.rows.extend(stored)
            return stored

    def delete_older_than(self, cutoff: datetime, *, timeout_sec: float) -> int:
        with self._lock:
            self._check()
            before = len(self.rows)
            self.rows = [row for row in self.rows if row.sampled_at >= cutoff]
            return before - len(self.rows)
