"""The default, embedded FtRuntimeStore: one SQLite file next to the controller.

It uses the stdlib :mod:`sqlite3` module run through :func:`asyncio.to_thread`, not SQLAlchemy or an async
driver: the store is a single tiny table that needs no migrations, and every operation is one short
transaction, so a connection per call (opened in the worker thread, closed before it returns) is cheap and
leaves no connection shared between threads.

The table::

    ft_runtime(instance_id TEXT PRIMARY KEY, revision INTEGER NOT NULL, value BLOB)

``revision`` is a per-key counter: 1 on the first insert, +1 on every write. A delete keeps the row as a
tombstone (``value IS NULL``) so that a record created again after a delete continues the counter: a writer
still holding a revision from before the delete can never match the new record (no ABA). Compare-and-swap is
``UPDATE … WHERE revision = ?`` (or the insert/tombstone revival for "must not exist yet") inside
``BEGIN IMMEDIATE``, so two store objects on the same file — or two controllers — serialise on SQLite's write
lock.

The file is created on first use, the directory is not: a missing directory means the configured location is
wrong or was removed, and starting over with an empty store would silently forget ``dead_committed``.
Durability stays at SQLite's default ``synchronous=FULL`` in WAL mode: these writes are rare and must survive
a power loss (F-50's write-ahead record is only evidence if it is on disk).
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from heteroflow.core.errors import StoreUnavailableError
from heteroflow.core.files import private_sqlite
from heteroflow.serving.controller.core.ranks import InstanceId
from heteroflow.serving.controller.core.runtime import PersistedRuntime

from .base import LoadResult, StoreConflictError, StoreCorruptError, StoredRuntime
from .codec import decode_runtime, encode_runtime

T = TypeVar("T")

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS ft_runtime ("
    " instance_id TEXT PRIMARY KEY,"
    " revision INTEGER NOT NULL CHECK (revision > 0),"
    " value BLOB"
    ")"
)


class SqliteFtRuntimeStore:
    """An :class:`~.base.FtRuntimeStore` in one SQLite file (the default when no etcd is configured)."""

    def __init__(self, path: Path, *, timeout_sec: float = 2.0) -> None:
        if timeout_sec <= 0:
            raise ValueError(f"timeout_sec must be positive, not {timeout_sec}")
        self.path = path
        self.timeout_sec = timeout_sec
        """Seconds any call may take, waiting for another writer's lock included."""
        self._schema_ready = False
        self._closed = False

    def __repr__(self) -> str:
        return f"SqliteFtRuntimeStore({str(self.path)!r})"

    # == the interface ===========================================================================================
    async def load_all(self) -> LoadResult:
        rows = await self._call(lambda conn: conn.execute(_SELECT_LIVE).fetchall())
        records: dict[InstanceId, StoredRuntime] = {}
        corrupt: dict[InstanceId, str] = {}
        for instance_id, revision, value in rows:
            key = InstanceId(str(instance_id))
            try:
                records[key] = StoredRuntime(record=_decode(value, key), revision=int(revision))
            except StoreCorruptError as exc:
                corrupt[key] = exc.reason
        return LoadResult(records=records, corrupt=corrupt)

    async def load(self, instance_id: InstanceId) -> StoredRuntime | None:
        row = await self._call(lambda conn: conn.execute(_SELECT_ONE, (instance_id,)).fetchone())
        if row is None:
            return None
        revision, value = row
        return StoredRuntime(record=_decode(value, instance_id), revision=int(revision))

    async def put(self, record: PersistedRuntime, *, expected_revision: int | None) -> int:
        data = encode_runtime(record)
        instance_id = record.instance_id

        def write(conn: sqlite3.Connection) -> int:
            with _write_transaction(conn):
                if expected_revision is None:
                    rows = conn.execute(_INSERT, (instance_id, data)).fetchall()
                else:
                    rows = conn.execute(_UPDATE, (data, instance_id, expected_revision)).fetchall()
                if not rows:
                    raise StoreConflictError(
                        instance_id, expected=expected_revision, actual=_live_revision(conn, instance_id)
                    )
                return int(rows[0][0])

        return await self._call(write)

    async def delete(self, instance_id: InstanceId, *, expected_revision: int) -> None:
        def remove(conn: sqlite3.Connection) -> None:
            with _write_transaction(conn):
                if conn.execute(_TOMBSTONE, (instance_id, expected_revision)).rowcount != 1:
                    raise StoreConflictError(
                        instance_id, expected=expected_revision, actual=_live_revision(conn, instance_id)
                    )

        await self._call(remove)

    async def ping(self) -> None:
        await self._call(lambda conn: conn.execute("SELECT 1 FROM ft_runtime LIMIT 1").fetchall())

    async def close(self) -> None:
        self._closed = True  # connections live only inside a call; nothing else to release

    # == plumbing ================================================================================================
    async def _call(self, operation: Callable[[sqlite3.Connection], T]) -> T:
        """Runs ``operation`` on a fresh connection in a worker thread, bounded by ``timeout_sec``.

        SQLite's busy timeout bounds the wait for another writer; the asyncio deadline bounds everything else
        (a stalled file system). When the deadline fires the thread may still finish: for a write the outcome
        is then unknown, as :class:`StoreUnavailableError` says.
        """
        if self._closed:
            raise StoreUnavailableError(f"{self!r} is closed")
        try:
            async with asyncio.timeout(self.timeout_sec):
                return await asyncio.to_thread(self._run, operation)
        except TimeoutError as exc:
            raise StoreUnavailableError(f"{self!r} did not answer within {self.timeout_sec} s") from exc

    def _run(self, operation: Callable[[sqlite3.Connection], T]) -> T:
        try:
            if not self._schema_ready and str(self.path) != ":memory:" and Path(self.path).parent.is_dir():
                # the runtime at rest: 0600 whatever the umask (a missing folder stays an error, never created)
                private_sqlite(Path(self.path), create_folder=False)
            # The lock wait gets most of the deadline, not all: it then ends inside the thread (nothing written,
            # outcome known) before the asyncio deadline gives up on the thread.
            conn = sqlite3.connect(self.path, timeout=self.timeout_sec * 0.75, isolation_level=None)
        except (sqlite3.Error, OSError) as exc:
            raise StoreUnavailableError(f"{self!r} cannot be opened: {exc}") from exc
        try:
            if not self._schema_ready:
                self._create_schema(conn)
            return operation(conn)
        except sqlite3.Error as exc:
            # OperationalError (locked, read-only, disk I/O, missing table of a removed file) and
            # DatabaseError (not a database file) alike: the store cannot do its job right now.
            raise StoreUnavailableError(f"{self!r} failed: {exc}") from exc
        finally:
            conn.close()

    def _create_schema(self, conn: sqlite3.Connection) -> None:
        # WAL lets readers (a status page, a second controller's load) proceed while one writer commits.
        try:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()
        except sqlite3.OperationalError as exc:
            # Two connections switching a new file to WAL at once: the second is refused at once ("database is
            # locked"), without SQLite's busy wait. The next statement does wait for the first, whose switch
            # is then on the file.
            if "locked" not in str(exc):
                raise
            conn.execute(_SCHEMA)
            mode = conn.execute("PRAGMA journal_mode").fetchone()
            if mode is None or str(mode[0]).lower() != "wal":
                mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()
        if mode is None or str(mode[0]).lower() != "wal":
            raise StoreUnavailableError(f"{self!r} cannot use write-ahead logging (journal_mode={mode!r})")
        conn.execute(_SCHEMA)
        self._schema_ready = True


_SELECT_LIVE = "SELECT instance_id, revision, value FROM ft_runtime WHERE value IS NOT NULL ORDER BY instance_id"
_SELECT_ONE = "SELECT revision, value FROM ft_runtime WHERE instance_id = ? AND value IS NOT NULL"
_INSERT = (
    # "must not exist yet": a new row at revision 1, or a tombstone revived at its next revision.
    "INSERT INTO ft_runtime (instance_id, revision, value) VALUES (?, 1, ?)"
    " ON CONFLICT (instance_id) DO UPDATE SET revision = ft_runtime.revision + 1, value = excluded.value"
    " WHERE ft_runtime.value IS NULL"
    " RETURNING revision"
)
_UPDATE = (
    "UPDATE ft_runtime SET revision = revision + 1, value = ?"
    " WHERE instance_id = ? AND revision = ? AND value IS NOT NULL"
    " RETURNING revision"
)
_TOMBSTONE = (
    "UPDATE ft_runtime SET revision = revision + 1, value = NULL"
    " WHERE instance_id = ? AND revision = ? AND value IS NOT NULL"
)


@contextlib.contextmanager
def _write_transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """``BEGIN IMMEDIATE`` … ``COMMIT``, rolled back on any error (a conflict included).

    IMMEDIATE takes the write lock before the first read, so the revision a conflict reports is the one the
    refused write actually met.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _live_revision(conn: sqlite3.Connection, instance_id: str) -> int | None:
    row = conn.execute(_SELECT_ONE, (instance_id,)).fetchone()
    return None if row is None else int(row[0])


def _decode(value: object, instance_id: InstanceId) -> PersistedRuntime:
    if not isinstance(value, bytes):
        # A value written through another tool as TEXT (or a number) is not one of ours.
        raise StoreCorruptError(f"stored value is {type(value).__name__}, not bytes", instance_id=instance_id)
    return decode_runtime(value, instance_id=instance_id)
