from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from heteroflow.core.ids import NodeId
from heteroflow.health.counters import Counters
from heteroflow.health.samples import CardKey, HealthReading, StoredSample
from heteroflow.health.write_policy import WriteReason, decide_write

KEY = CardKey(node_id=NodeId("n"), gpu_index=0, source="real")
T0 = datetime(2026, 1, 1, tzinfo=UTC)
KEEPALIVE = timedelta(minutes=5)


def reading(at: float, uuid: str | None = "G", **counters: int | None) -> HealthReading:
    return HealthReading(key=KEY, uuid=uuid, sampled_at=T0 + timedelta(seconds=at), counters=Counters(**counters))


def stored(at: float, uuid: str | None = "G", **counters: int | None) -> StoredSample:
    r = reading(at, uuid, **counters)
    return StoredSample(key=r.key, uuid=r.uuid, sampled_at=r.sampled_at, counters=r.counters)


@pytest.mark.parametrize(
    ("new", "latest", "expected"),
    [
        (reading(0, ecc_corrected_total=1), None, WriteReason.FIRST),
        (reading(5, ecc_corrected_total=1), stored(0, ecc_corrected_total=1), None),
        (reading(5, ecc_corrected_total=2), stored(0, ecc_corrected_total=1), WriteReason.CHANGED),
        (reading(5, ecc_corrected_total=1, retired_pages=0), stored(0, ecc_corrected_total=1), WriteReason.CHANGED),
        (reading(5, ecc_corrected_total=1), stored(0, ecc_corrected_total=1, retired_pages=0), WriteReason.CHANGED),
        (reading(5, uuid="H", ecc_corrected_total=1), stored(0, ecc_corrected_total=1), WriteReason.UUID_CHANGED),
        (reading(5, uuid=None, ecc_corrected_total=1), stored(0, ecc_corrected_total=1), WriteReason.UUID_CHANGED),
        (reading(299.999, ecc_corrected_total=1), stored(0, ecc_corrected_total=1), None),
        (reading(300, ecc_corrected_total=1), stored(0, ecc_corrected_total=1), WriteReason.KEEPALIVE),
        # a decrease (driver reload) is a change, stored as read: never clamped (H-3)
        (reading(5, ecc_corrected_total=0), stored(0, ecc_corrected_total=9), WriteReason.CHANGED),
    ],
)
def test_decide_write(new: HealthReading, latest: StoredSample | None, expected: WriteReason | None) -> None:
    assert decide_write(new, latest, keepalive=KEEPALIVE) == expected
