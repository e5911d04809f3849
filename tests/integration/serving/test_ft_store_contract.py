"""One contract for every FtRuntimeStore (SQLite and a real etcd), then each backend's outages (F-32, F-50)."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import aetcd
import pytest

from heteroflow.core.errors import StoreUnavailableError
from heteroflow.core.testing import free_port
from heteroflow.serving.controller.core.phase import FtPhase
from heteroflow.serving.controller.core.ranks import InstanceId, RequestId, ranks
from heteroflow.serving.controller.core.runtime import FallbackStrategy, PersistedRuntime, WriteAheadRecord
from heteroflow.serving.controller.store import (
    EtcdFtRuntimeStore,
    FtRuntimeStore,
    SqliteFtRuntimeStore,
    StoreConflictError,
    StoreCorruptError,
    StoredRuntime,
    encode_runtime,
    open_store,
)
from heteroflow.serving.controller.store.testing import EtcdServer

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

MARGIN_SEC = 1.0
"""How much later than its ``timeout_sec`` a failing call may return (scheduling on a loaded 2-core machine)."""
OUTAGE_SEC = 1.3
"""How long the etcd outage test keeps calling a stopped etcd. gRPC's reconnect back-offs are 1 s, 1.6 s, 2.56 s
(±20 %): a channel kept through 1.3 s of refusals has dialled at 0 s and by 1.2 s and next dials at 2.08 s or later,
after the test's etcd is back (0.1-0.2 s to start, with its 100 ms election timeout)."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def runtime(instance: str = "decode-0", *, generation: int = 0, phase: FtPhase = FtPhase.NORMAL) -> PersistedRuntime:
    return PersistedRuntime(
        instance_id=InstanceId(instance),
        phase=phase,
        generation=generation,
        original_dp_ranks=ranks([0, 1, 2, 3]),
        dead_committed=ranks([1]) if generation else frozenset(),
        fallback=FallbackStrategy.ENGINE_RELAUNCH if generation else None,
        write_ahead=WriteAheadRecord(request_id=RequestId("r-1"), pending_removed=ranks([2]), phase=phase)
        if phase == FtPhase.DECIDING
        else None,
    )


INSTANCE = InstanceId("decode-0")


# == the backends ==================================================================================================
@dataclass
class Backend:
    """A fresh, empty store location and how to reach it."""

    name: str
    open: Callable[[float], FtRuntimeStore]
    """A new store object (``timeout_sec``) on this location: two of them are two controllers."""
    write_raw: Callable[[str, bytes], Awaitable[None]]
    """Writes bytes for an instance id straight into the backend, past the codec."""


def sqlite_backend(path: Path) -> Backend:
    async def write_raw(instance_id: str, value: bytes) -> None:
        creator = SqliteFtRuntimeStore(path)
        await creator.ping()  # creates the table
        await creator.close()
        with sqlite3.connect(path) as conn:
            conn.execute("INSERT INTO ft_runtime (instance_id, revision, value) VALUES (?, 1, ?)", (instance_id, value))
        conn.close()

    return Backend("sqlite", lambda timeout: SqliteFtRuntimeStore(path, timeout_sec=timeout), write_raw)


def etcd_backend(endpoint: str, prefix: str) -> Backend:
    host, port = endpoint.rsplit(":", 1)

    async def write_raw(instance_id: str, value: bytes) -> None:
        async with aetcd.Client(host=host, port=int(port), timeout=5) as client:
            await client.put((prefix + instance_id).encode(), value)

    return Backend("etcd", lambda timeout: EtcdFtRuntimeStore(endpoint, prefix=prefix, timeout_sec=timeout), write_raw)


@pytest.fixture(params=["sqlite", "etcd"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "sqlite":
        return sqlite_backend(tmp_path / "ft.db")
    return etcd_backend(request.getfixturevalue("etcd_endpoint"), request.getfixturevalue("etcd_prefix"))


Opener = Callable[..., FtRuntimeStore]


@pytest.fixture
async def open_store_object(backend: Backend) -> AsyncIterator[Opener]:
    """Opens store objects on the backend and closes them after the test."""
    opened: list[FtRuntimeStore] = []

    def open_(timeout_sec: float = 2.0) -> FtRuntimeStore:
        store = backend.open(timeout_sec)
        opened.append(store)
        return store

    yield open_
    for store in opened:
        await store.close()


# == the contract ==================================================================================================
async def test_put_then_load_gives_back_the_record_and_its_revision(open_store_object: Opener) -> None:
    store = open_store_object()
    assert await store.load(INSTANCE) is None
    first = await store.put(runtime(), expected_revision=None)
    assert first > 0
    assert await store.load(INSTANCE) == StoredRuntime(record=runtime(), revision=first)

    changed = runtime(generation=1, phase=FtPhase.DECIDING)
    second = await store.put(changed, expected_revision=first)
    assert second > first
    assert await store.load(INSTANCE) == StoredRuntime(record=changed, revision=second)
    everything = await store.load_all()
    assert everything.records == {INSTANCE: StoredRuntime(record=changed, revision=second)}
    assert everything.corrupt == {}


async def test_creating_a_record_that_exists_conflicts(open_store_object: Opener) -> None:
    store = open_store_object()
    revision = await store.put(runtime(), expected_revision=None)
    with pytest.raises(StoreConflictError) as caught:
        await store.put(runtime(generation=5), expected_revision=None)
    assert (caught.value.expected, caught.value.actual) == (None, revision)
    assert await store.load(INSTANCE) == StoredRuntime(record=runtime(), revision=revision)


async def test_a_stale_or_invented_revision_conflicts(open_store_object: Opener) -> None:
    store = open_store_object()
    first = await store.put(runtime(), expected_revision=None)
    second = await store.put(runtime(generation=1), expected_revision=first)
    for wrong in (first, second + 1000, 0):
        with pytest.raises(StoreConflictError) as caught:
            await store.put(runtime(generation=2), expected_revision=wrong)
        assert (caught.value.expected, caught.value.actual) == (wrong, second)
    assert await store.load(INSTANCE) == StoredRuntime(record=runtime(generation=1), revision=second)


async def test_updating_a_record_that_does_not_exist_conflicts(open_store_object: Opener) -> None:
    store = open_store_object()
    for wrong in (1, 0):  # 0 must not mean "create" either
        with pytest.raises(StoreConflictError) as caught:
            await store.put(runtime(), expected_revision=wrong)
        assert caught.value.actual is None
    assert await store.load(INSTANCE) is None


async def test_delete_is_compare_and_swap_and_a_recreated_record_never_reuses_a_revision(
    open_store_object: Opener,
) -> None:
    store = open_store_object()
    first = await store.put(runtime(), expected_revision=None)
    second = await store.put(runtime(generation=1), expected_revision=first)
    with pytest.raises(StoreConflictError) as caught:
        await store.delete(INSTANCE, expected_revision=first)
    assert caught.value.actual == second
    assert await store.load(INSTANCE) is not None

    await store.delete(INSTANCE, expected_revision=second)
    assert await store.load(INSTANCE) is None
    assert (await store.load_all()).records == {}
    with pytest.raises(StoreConflictError) as caught:
        await store.delete(INSTANCE, expected_revision=second)
    assert caught.value.actual is None

    again = await store.put(runtime(), expected_revision=None)
    assert again > second  # a writer still holding an old revision can never match the new record (no ABA)
    for old in (first, second):
        with pytest.raises(StoreConflictError):
            await store.put(runtime(generation=9), expected_revision=old)


async def test_load_all_reports_corrupt_records_and_keeps_the_good_ones(
    backend: Backend, open_store_object: Opener
) -> None:
    store = open_store_object()
    good = await store.put(runtime(), expected_revision=None)
    await backend.write_raw("garbage", b"\xff")
    await backend.write_raw("future", b'{"schema": 2}')
    await backend.write_raw("impostor", encode_runtime(runtime("decode-0")))

    loaded = await store.load_all()
    assert loaded.records == {INSTANCE: StoredRuntime(record=runtime(), revision=good)}
    assert set(loaded.corrupt) == {"garbage", "future", "impostor"}
    assert "not a JSON document" in loaded.corrupt[InstanceId("garbage")]
    assert "schema 1 only" in loaded.corrupt[InstanceId("future")]
    assert "the record is for 'decode-0'" in loaded.corrupt[InstanceId("impostor")]
    with pytest.raises(StoreCorruptError) as caught:
        await store.load(InstanceId("garbage"))
    assert caught.value.instance_id == "garbage"


async def test_two_store_objects_see_each_others_writes(open_store_object: Opener) -> None:
    one, two = open_store_object(), open_store_object()
    first = await one.put(runtime(), expected_revision=None)
    assert await two.load(INSTANCE) == StoredRuntime(record=runtime(), revision=first)
    second = await two.put(runtime(generation=1), expected_revision=first)
    assert await one.load(INSTANCE) == StoredRuntime(record=runtime(generation=1), revision=second)
    with pytest.raises(StoreConflictError):
        await one.put(runtime(generation=2), expected_revision=first)


async def test_of_two_concurrent_writes_with_the_same_expected_revision_exactly_one_wins(
    open_store_object: Opener,
) -> None:
    one, two = open_store_object(), open_store_object()
    revision: int | None = None  # the first round races on "must not exist yet"
    for round_number in range(6):
        mine, theirs = runtime(generation=2 * round_number), runtime(generation=2 * round_number + 1)
        results = await asyncio.gather(
            one.put(mine, expected_revision=revision),
            two.put(theirs, expected_revision=revision),
            return_exceptions=True,
        )
        won = [
            (result, record) for result, record in zip(results, (mine, theirs), strict=True) if isinstance(result, int)
        ]
        lost = [result for result in results if isinstance(result, StoreConflictError)]
        assert len(won) == 1, results
        assert len(lost) == 1, results
        new_revision, winner = won[0]
        assert lost[0].actual == new_revision
        assert await two.load(INSTANCE) == StoredRuntime(record=winner, revision=new_revision)
        assert revision is None or new_revision > revision
        revision = new_revision


async def test_revisions_of_a_record_strictly_increase_whoever_writes(open_store_object: Opener) -> None:
    one, two = open_store_object(), open_store_object()
    revisions: list[int] = []
    mine: int | None = None
    other: int | None = None
    for step in range(8):
        store = (one, two)[step % 2]
        mine = await store.put(runtime(generation=step), expected_revision=mine)
        revisions.append(mine)
        other = await store.put(runtime("other", generation=step), expected_revision=other)  # writes elsewhere
    assert all(earlier < later for earlier, later in pairwise(revisions)), revisions


async def test_ping_answers_and_a_closed_store_refuses(open_store_object: Opener) -> None:
    store = open_store_object()
    await store.ping()
    await store.close()
    await store.close()  # idempotent
    with pytest.raises(StoreUnavailableError):
        await store.load(INSTANCE)


# == URLs ==========================================================================================================
async def test_open_store_reaches_both_backends(tmp_path: Path, etcd_endpoint: str, etcd_prefix: str) -> None:
    stores = [
        open_store(f"sqlite:///{tmp_path / 'ft.db'}", timeout_sec=2.0),
        open_store(f"etcd://{etcd_endpoint}?prefix={etcd_prefix}", timeout_sec=2.0),
    ]
    assert isinstance(stores[0], SqliteFtRuntimeStore)
    assert isinstance(stores[1], EtcdFtRuntimeStore)
    assert stores[1].prefix == etcd_prefix
    for store in stores:
        revision = await store.put(runtime(), expected_revision=None)
        assert (await store.load(INSTANCE)) == StoredRuntime(record=runtime(), revision=revision)
        await store.close()
    assert (tmp_path / "ft.db").is_file()


def test_open_store_parses_endpoint_lists_and_the_default_prefix() -> None:
    store = open_store("etcd://10.0.0.1:2379,etcd-b:2380/", timeout_sec=1.5)
    assert isinstance(store, EtcdFtRuntimeStore)
    assert store.endpoints == (("10.0.0.1", 2379), ("etcd-b", 2380))
    assert store.prefix == "/heteroflow/ft/runtime/"
    assert store.timeout_sec == 1.5
    sqlite_store = open_store("sqlite:///relative/ft.db", timeout_sec=1.0)
    assert isinstance(sqlite_store, SqliteFtRuntimeStore)
    assert sqlite_store.path == Path("relative/ft.db")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("postgresql://db/ft", "unsupported FT runtime store URL"),
        ("ft.db", "unsupported FT runtime store URL"),
        ("sqlite://ft.db", "three slashes"),
        ("sqlite:///", "must name a file"),
        ("sqlite:///:memory:", "must name a file"),
        ("etcd://", "must be etcd://HOST:PORT"),
        ("etcd://localhost", "is not host:port"),
        ("etcd://a:1,b", "is not host:port"),
        ("etcd://a:99999", "is not host:port"),
        ("etcd://user:pw@a:1", "credentials"),
        ("etcd://a:1/heteroflow/", "not in the path"),
        ("etcd://a:1?prefix=/a/&prefix=/b/", "given 2 times"),
        ("etcd://a:1?namespace=x", "unknown parameters"),
        ("etcd://a:1?prefix=no-slashes", "start and end with '/'"),
    ],
)
def test_open_store_refuses_other_urls_clearly(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        open_store(url, timeout_sec=1.0)


# == outages: etcd =================================================================================================
async def test_etcd_stopped_fails_fast_and_the_same_store_works_once_it_is_back(own_etcd_server: EtcdServer) -> None:
    timeout = 1.0
    store = EtcdFtRuntimeStore(own_etcd_server.endpoint, timeout_sec=timeout)
    try:
        revision = await store.put(runtime(), expected_revision=None)
        own_etcd_server.stop()
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: store.put(runtime(generation=1), expected_revision=revision),
            lambda: store.load(INSTANCE),
            store.load_all,
            store.ping,
        ]
        # Keep failing for a while, as a controller retrying its persist would: long enough for gRPC's reconnect
        # back-off to grow past etcd's restart time, so a store that kept its old channel would still be refused
        # after the restart.
        outage_ends = time.monotonic() + OUTAGE_SEC
        attempts = 0
        while attempts < len(calls) or time.monotonic() < outage_ends:
            started = time.monotonic()
            with pytest.raises(StoreUnavailableError):
                await calls[attempts % len(calls)]()
            assert time.monotonic() - started < timeout + MARGIN_SEC
            attempts += 1
            await asyncio.sleep(0.05)  # the retry cadence of that controller, not a wait for an event

        own_etcd_server.start()
        # The very first call after the restart succeeds, and what was written before the outage is there.
        assert await store.load(INSTANCE) == StoredRuntime(record=runtime(), revision=revision)
        assert await store.put(runtime(generation=1), expected_revision=revision) > revision
    finally:
        await store.close()


async def test_a_frozen_etcd_times_out_instead_of_hanging(own_etcd_server: EtcdServer) -> None:
    timeout = 0.5
    store = EtcdFtRuntimeStore(own_etcd_server.endpoint, timeout_sec=timeout)
    try:
        revision = await store.put(runtime(), expected_revision=None)
        own_etcd_server.pause()
        calls: list[Callable[[], Awaitable[object]]] = [lambda: store.load(INSTANCE), store.ping]
        for call in calls:
            started = time.monotonic()
            with pytest.raises(StoreUnavailableError):
                await call()
            elapsed = time.monotonic() - started
            assert timeout * 0.8 < elapsed < timeout + MARGIN_SEC  # it waited for the deadline, not longer
        own_etcd_server.resume()
        assert await store.load(INSTANCE) == StoredRuntime(record=runtime(), revision=revision)
    finally:
        await store.close()


async def test_a_store_whose_etcd_never_started_is_unavailable_not_hanging() -> None:
    # A port nothing listens on: the first call of a fresh store (connecting included) is bounded too.
    store = EtcdFtRuntimeStore(f"127.0.0.1:{free_port()}", timeout_sec=0.5)
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError):
        await store.load_all()
    assert time.monotonic() - started < 0.5 + MARGIN_SEC
    await store.close()


# == outages: SQLite ===============================================================================================
async def test_sqlite_in_a_removed_directory_is_unavailable(tmp_path: Path) -> None:
    directory = tmp_path / "state"
    directory.mkdir()
    store = SqliteFtRuntimeStore(directory / "ft.db", timeout_sec=1.0)
    revision = await store.put(runtime(), expected_revision=None)
    shutil.rmtree(directory)
    for call in (lambda: store.put(runtime(generation=1), expected_revision=revision), lambda: store.load(INSTANCE)):
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError):
            await call()
        assert time.monotonic() - started < 1.0 + MARGIN_SEC
    assert not directory.exists()  # never silently recreated empty: that would forget dead_committed


async def test_sqlite_never_creates_a_missing_directory(tmp_path: Path) -> None:
    store = SqliteFtRuntimeStore(tmp_path / "absent" / "ft.db", timeout_sec=1.0)
    with pytest.raises(StoreUnavailableError, match="unable to open"):
        await store.ping()


async def test_sqlite_two_stores_opening_a_new_file_at_once_both_work(tmp_path: Path) -> None:
    # Two controllers starting on one new file switch it to WAL at the same moment; SQLite refuses the second
    # switch at once ("database is locked", no busy wait). Measured before the fix: 32 of 300 such races failed.
    for attempt in range(40):
        path = tmp_path / f"ft-{attempt}.db"
        one, two = SqliteFtRuntimeStore(path), SqliteFtRuntimeStore(path)
        results = await asyncio.gather(one.ping(), two.ping(), return_exceptions=True)
        assert [r for r in results if isinstance(r, BaseException)] == [], (attempt, results)
        assert await one.put(runtime(), expected_revision=None) == 1
        await one.close()
        await two.close()


async def test_sqlite_locked_by_another_writer_times_out_then_recovers(tmp_path: Path) -> None:
    path = tmp_path / "ft.db"
    timeout = 0.5
    store = SqliteFtRuntimeStore(path, timeout_sec=timeout)
    revision = await store.put(runtime(), expected_revision=None)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError, match="locked"):
            await store.put(runtime(generation=1), expected_revision=revision)
        assert time.monotonic() - started < timeout + MARGIN_SEC
        # WAL: readers are not blocked by the writer.
        assert await store.load(INSTANCE) == StoredRuntime(record=runtime(), revision=revision)
        other.execute("ROLLBACK")
    finally:
        other.close()
    assert await store.put(runtime(generation=1), expected_revision=revision) > revision


async def test_sqlite_file_that_is_not_a_database_is_unavailable_not_corrupt_records(tmp_path: Path) -> None:
    path = tmp_path / "ft.db"
    path.write_bytes(b"this is not a database file" * 100)
    store = SqliteFtRuntimeStore(path, timeout_sec=1.0)
    with pytest.raises(StoreUnavailableError, match="not a database"):
        await store.load_all()


async def test_sqlite_value_stored_as_text_is_a_corrupt_record(tmp_path: Path) -> None:
    path = tmp_path / "ft.db"
    store = SqliteFtRuntimeStore(path, timeout_sec=1.0)
    await store.ping()
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO ft_runtime VALUES ('texty', 1, ?)", (encode_runtime(runtime("texty")).decode(),))
    conn.close()
    loaded = await store.load_all()
    assert loaded.corrupt == {"texty": "stored value is str, not bytes"}
