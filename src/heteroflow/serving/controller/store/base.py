"""The FtRuntimeStore interface, what it returns, and its errors (``serving-ft.md`` F-32, F-50).

The controller keeps one :class:`~heteroflow.serving.controller.core.runtime.PersistedRuntime` per instance and
writes it only by compare-and-swap on a *revision*, so that two controllers (or a controller and its own stale
view after a restart) can never overwrite each other silently: the write-ahead record of F-50 is only evidence
if a lost update is impossible.

Errors::

    Exception
    ├── FtStoreError                  permanent for this call: retrying the same call gives the same answer
    │   ├── StoreConflictError        a compare-and-swap lost: reload, decide again, write again
    │   ├── NotLeaderError            the write is fenced by a leader lease this controller no longer holds
    │   └── StoreCorruptError         a stored record cannot be decoded (or a record would not round-trip)
    └── heteroflow.core.errors.StoreUnavailableError
                                      the backend did not answer in ``timeout_sec`` or failed; retry later.
                                      For a write the outcome is unknown: reload to learn whether it landed.

``StoreUnavailableError`` is deliberately not an ``FtStoreError``: it is the project-wide "try again later"
error, and callers that retry stores treat every store alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from heteroflow.serving.controller.core.ranks import InstanceId
from heteroflow.serving.controller.core.runtime import PersistedRuntime


class FtStoreError(Exception):
    """A store answered, and the answer is a refusal that retrying the same call will not change."""


class StoreConflictError(FtStoreError):
    """A compare-and-swap found another revision than the one expected (F-50: someone else wrote first)."""

    def __init__(self, instance_id: str, *, expected: int | None, actual: int | None) -> None:
        self.instance_id = instance_id
        self.expected = expected
        """The revision the caller expected; ``None``: the caller expected no record."""
        self.actual = actual
        """The stored revision when the write was refused; ``None``: no record is stored."""
        want = "no record" if expected is None else f"revision {expected}"
        have = "no record" if actual is None else f"revision {actual}"
        super().__init__(f"runtime of {instance_id!r}: expected {want}, the store has {have}")


class NotLeaderError(FtStoreError):
    """A fenced write was refused: the leader key no longer holds this controller's claim (another controller
    leads, or the lease expired). The caller must stop acting; nothing was written."""

    def __init__(self, instance_id: str, *, holder: str | None) -> None:
        self.instance_id = instance_id
        self.holder = holder
        """The leader key's value when the write was refused; ``None``: nobody holds it."""
        who = "nobody" if holder is None else holder
        super().__init__(f"runtime of {instance_id!r}: this controller no longer leads (the leader key names {who})")


class StoreCorruptError(FtStoreError):
    """Stored bytes that are not a valid record of a schema this code knows; never guessed at or repaired."""

    def __init__(self, reason: str, *, instance_id: str | None = None) -> None:
        self.reason = reason
        self.instance_id = instance_id
        where = f"runtime of {instance_id!r}: " if instance_id is not None else ""
        super().__init__(f"{where}{reason}")


@dataclass(frozen=True, slots=True)
class StoredRuntime:
    """A record as stored, with the revision a compare-and-swap must quote to replace or delete it."""

    record: PersistedRuntime
    revision: int
    """Positive; a later write of the same key always gets a larger one, even after a delete (no ABA)."""


@dataclass(frozen=True, slots=True)
class LoadResult:
    """Every stored runtime. A record that cannot be decoded is listed in ``corrupt`` with the reason instead:
    one bad record must neither stop a controller from starting nor vanish without a trace."""

    records: dict[InstanceId, StoredRuntime]
    corrupt: dict[InstanceId, str]


class FtRuntimeStore(Protocol):
    """Where the controller persists each instance's :class:`PersistedRuntime` (F-32).

    Every call returns or raises within the store's ``timeout_sec``; any backend failure surfaces as
    :class:`~heteroflow.core.errors.StoreUnavailableError`.
    """

    async def load_all(self) -> LoadResult:
        """Every stored runtime (a restarting controller's first read)."""
        ...

    async def load(self, instance_id: InstanceId) -> StoredRuntime | None:
        """One runtime, ``None`` when none is stored; :class:`StoreCorruptError` when it cannot be decoded."""
        ...

    async def put(self, record: PersistedRuntime, *, expected_revision: int | None) -> int:
        """Write ``record`` if the stored revision is ``expected_revision`` (``None``: only if no record is
        stored); returns the new revision. :class:`StoreConflictError` otherwise."""
        ...

    async def delete(self, instance_id: InstanceId, *, expected_revision: int) -> None:
        """Remove the record if its revision is ``expected_revision``; :class:`StoreConflictError` otherwise."""
        ...

    async def ping(self) -> None:
        """Returns when the backend answers; :class:`StoreUnavailableError` when it does not."""
        ...

    async def close(self) -> None:
        """Releases connections. Idempotent; the store must not be used afterwards."""
        ...
