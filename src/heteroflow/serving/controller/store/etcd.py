"""The production FtRuntimeStore: etcd v3 through ``aetcd`` (asyncio gRPC).

Each instance is one key, ``<prefix><instance_id>`` (default prefix ``/heteroflow/ft/runtime/``), whose value is
the codec's JSON. A record's revision is the key's ``mod_revision``: etcd's cluster-wide revision at the last
write of that key, so it grows on every write, also across a delete and a re-create (no ABA). Compare-and-swap
is one etcd transaction: ``create_revision == 0`` for "must not exist yet", ``create_revision > 0 and
mod_revision == expected`` otherwise; its success branch writes and reads the key back (the read gives the new
``mod_revision``), its failure branch reads the key (the revision the conflict reports).

Outages: every call runs under an asyncio deadline of ``timeout_sec`` (and the same gRPC deadline). Any gRPC
or client error, or the deadline, raises :class:`StoreUnavailableError` and discards the client: the next call
opens a fresh channel (on the next endpoint when several are configured), so a restarted etcd is used at once
rather than after gRPC's reconnect back-off. A write is never retried inside a call: after a lost response it
may have landed, and retrying it would report the caller's own write as a conflict.

Leadership (``docs/controller.md``, active/standby): the same store grants the controllers' leader lease
(:meth:`EtcdFtRuntimeStore.claim` puts the leader key under a lease only if no one holds it,
:meth:`~EtcdFtRuntimeStore.keep_alive` renews it) and, once :meth:`~EtcdFtRuntimeStore.fence` is set, every write
of a runtime is one transaction that also requires the leader key to still hold this controller's claim. A
controller whose lease expired while it was paused can therefore not write a single runtime afterwards: its write
fails with :class:`NotLeaderError` and changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aetcd

from heteroflow.core.errors import StoreUnavailableError
from heteroflow.serving.controller.core.ranks import InstanceId
from heteroflow.serving.controller.core.runtime import PersistedRuntime

from .base import LoadResult, NotLeaderError, StoreConflictError, StoreCorruptError, StoredRuntime
from .codec import decode_runtime, encode_runtime

T = TypeVar("T")

DEFAULT_PREFIX = "/heteroflow/ft/runtime/"

# What aetcd and gRPC raise: ClientError wraps every mapped RPC status; BaseError covers the channel's own
# errors (a call on a channel another task just closed); OSError a resolver or socket failure.
_BACKEND_ERRORS: tuple[type[BaseException], ...] = (aetcd.ClientError, aetcd.rpc.BaseError, OSError, TimeoutError)


def parse_endpoints(endpoints: str) -> tuple[tuple[str, int], ...]:
    """``"host:port[,host:port…]"`` → ((host, port), …); :class:`ValueError` names what is wrong."""
    parsed: list[tuple[str, int]] = []
    for item in endpoints.split(","):
        endpoint = item.strip()
        host, sep, port_text = endpoint.rpartition(":")
        if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ValueError(f"etcd endpoint {endpoint!r} is not host:port (in {endpoints!r})")
        parsed.append((host, int(port_text)))
    return tuple(parsed)


class EtcdFtRuntimeStore:
    """An :class:`~.base.FtRuntimeStore` on an etcd v3 cluster (production, F-32)."""

    def __init__(self, endpoints: str, *, prefix: str = DEFAULT_PREFIX, timeout_sec: float = 2.0) -> None:
        if timeout_sec <= 0:
            raise ValueError(f"timeout_sec must be positive, not {timeout_sec}")
        if not prefix.startswith("/") or not prefix.endswith("/"):
            # The trailing slash keeps a range read of this prefix from picking up a sibling ("/a/runtime2/…").
            raise ValueError(f"etcd prefix must start and end with '/', not {prefix!r}")
        self.endpoints = parse_endpoints(endpoints)
        self.prefix = prefix
        self.timeout_sec = timeout_sec
        """Seconds any call may take, connecting included."""
        self._prefix_key = prefix.encode("utf-8")
        self._client: Any = None
        self._endpoint_index = 0
        self._closing: set[asyncio.Task[None]] = set()
        self._closed = False
        self._fence: tuple[bytes, bytes] | None = None

    def __repr__(self) -> str:
        where = ",".join(f"{host}:{port}" for host, port in self.endpoints)
        return f"EtcdFtRuntimeStore({where!r}, prefix={self.prefix!r})"

    # == the interface ===========================================================================================
    async def load_all(self) -> LoadResult:
        async def read(client: Any) -> list[tuple[bytes, bytes, int]]:
            found = await client.get_prefix(self._prefix_key)
            return [(bytes(kv.key), bytes(kv.value), int(kv.mod_revision)) for kv in found]

        records: dict[InstanceId, StoredRuntime] = {}
        corrupt: dict[InstanceId, str] = {}
        for key, value, revision in await self._call(read):
            raw_id = key[len(self._prefix_key) :]
            try:
                instance_id = InstanceId(raw_id.decode("utf-8"))
            except UnicodeDecodeError:
                corrupt[InstanceId(raw_id.decode("utf-8", "backslashreplace"))] = "the key is not UTF-8 text"
                continue
            try:
                records[instance_id] = StoredRuntime(
                    record=decode_runtime(value, instance_id=instance_id), revision=revision
                )
            except StoreCorruptError as exc:
                corrupt[instance_id] = exc.reason
        return LoadResult(records=records, corrupt=corrupt)

    async def load(self, instance_id: InstanceId) -> StoredRuntime | None:
        key = self._key(instance_id)

        async def read(client: Any) -> tuple[bytes, int] | None:
            found = await client.get(key)
            return None if found is None else (bytes(found.value), int(found.mod_revision))

        found = await self._call(read)
        if found is None:
            return None
        value, revision = found
        return StoredRuntime(record=decode_runtime(value, instance_id=instance_id), revision=revision)

    async def put(self, record: PersistedRuntime, *, expected_revision: int | None) -> int:
        key = self._key(record.instance_id)
        value = encode_runtime(record)

        async def write(client: Any) -> tuple[bool, int | None]:
            ops = client.transactions
            succeeded, responses = await client.transaction(
                compare=self._expect(ops, key, expected_revision) + self._fenced(ops),
                success=[ops.put(key, value), ops.get(key)],
                failure=[ops.get(key), *self._fence_read(ops)],
            )
            if not succeeded:
                self._check_fence(record.instance_id, responses)
            return bool(succeeded), _read_revision(responses[0] if not succeeded else responses[-1])

        succeeded, revision = await self._call(write)
        if not succeeded:
            raise StoreConflictError(record.instance_id, expected=expected_revision, actual=revision)
        if revision is None:  # the transaction's own read found nothing: not an etcd we understand
            raise StoreUnavailableError(f"{self!r}: the write of {record.instance_id!r} reads back nothing")
        return revision

    async def delete(self, instance_id: InstanceId, *, expected_revision: int) -> None:
        key = self._key(instance_id)

        async def remove(client: Any) -> tuple[bool, int | None]:
            ops = client.transactions
            succeeded, responses = await client.transaction(
                compare=self._expect(ops, key, expected_revision) + self._fenced(ops),
                success=[ops.delete(key)],
                failure=[ops.get(key), *self._fence_read(ops)],
            )
            if not succeeded:
                self._check_fence(instance_id, responses)
            return bool(succeeded), None if succeeded else _read_revision(responses[0])

        succeeded, actual = await self._call(remove)
        if not succeeded:
            raise StoreConflictError(instance_id, expected=expected_revision, actual=actual)

    async def ping(self) -> None:
        async def read(client: Any) -> None:
            # A linearizable read: it needs a leader, which is what a write will need too.
            await client.get(self._prefix_key)

        await self._call(read)

    # == leadership ==============================================================================================
    def fence(self, key: str, claim: bytes | None) -> None:
        """From now on every write also requires ``key`` to hold ``claim`` (this controller's leadership), else it
        raises :class:`NotLeaderError`; ``None`` lifts the fence."""
        self._fence = None if claim is None else (key.encode("utf-8"), claim)

    async def grant_lease(self, ttl_sec: int) -> tuple[int, int]:
        """A new lease: ``(lease id, granted TTL in seconds)`` (etcd may grant more than asked for)."""

        async def grant(client: Any) -> tuple[int, int]:
            lease = await client.lease(ttl_sec)
            return int(lease.id), int(lease.ttl)

        return await self._call(grant)

    async def claim(self, key: str, claim: bytes, lease_id: int) -> bytes | None:
        """Put ``claim`` at ``key`` under the lease if nobody holds the key; ``None`` when it was put, else the
        holder's claim (the key exists and is someone else's, or ours from an earlier lease)."""
        raw = key.encode("utf-8")

        async def put_if_absent(client: Any) -> bytes | None:
            ops = client.transactions
            succeeded, responses = await client.transaction(
                compare=[ops.create(raw) == 0], success=[ops.put(raw, claim, lease_id)], failure=[ops.get(raw)]
            )
            if succeeded:
                return None
            entries = list(responses[0])
            return bytes(entries[0][0]) if entries else b""

        return await self._call(put_if_absent)

    async def read_claim(self, key: str) -> bytes | None:
        """The value at ``key``; ``None`` when absent."""

        async def read(client: Any) -> bytes | None:
            found = await client.get(key.encode("utf-8"))
            return None if found is None else bytes(found.value)

        return await self._call(read)

    async def keep_alive(self, lease_id: int) -> int:
        """Renew the lease; the TTL it now has (``<= 0``: the lease is gone, expired or revoked)."""

        async def refresh(client: Any) -> int:
            reply = await client.refresh_lease(lease_id)
            return -1 if reply is None else int(reply.TTL)

        return await self._call(refresh)

    async def revoke_lease(self, lease_id: int) -> None:
        """Give the lease up now: the keys under it are deleted, so a standby can claim at once."""

        async def revoke(client: Any) -> None:
            await client.revoke_lease(lease_id)

        await self._call(revoke)

    async def close(self) -> None:
        self._closed = True
        client, self._client = self._client, None
        await self._close_client(client)
        if self._closing:
            await asyncio.gather(*self._closing)

    # == plumbing ================================================================================================
    def _key(self, instance_id: str) -> bytes:
        return (self.prefix + instance_id).encode("utf-8")

    @staticmethod
    def _expect(ops: Any, key: bytes, expected_revision: int | None) -> list[Any]:
        if expected_revision is None:
            return [ops.create(key) == 0]
        # mod_revision alone would match an absent key when expected_revision is 0; create > 0 rules that out.
        return [ops.create(key) > 0, ops.mod(key) == expected_revision]

    def _fenced(self, ops: Any) -> list[Any]:
        if self._fence is None:
            return []
        key, claim = self._fence
        return [ops.value(key) == claim]

    def _fence_read(self, ops: Any) -> list[Any]:
        return [] if self._fence is None else [ops.get(self._fence[0])]

    def _check_fence(self, instance_id: str, responses: list[Any]) -> None:
        """After a failed fenced transaction: raise :class:`NotLeaderError` when the fence is what failed."""
        if self._fence is None:
            return
        entries = list(responses[1])
        holder = bytes(entries[0][0]) if entries else None
        if holder != self._fence[1]:
            raise NotLeaderError(instance_id, holder=None if holder is None else holder.decode("utf-8", "replace"))

    async def _call(self, operation: Callable[[Any], Awaitable[T]]) -> T:
        if self._closed:
            raise StoreUnavailableError(f"{self!r} is closed")
        client = self._current_client()
        try:
            async with asyncio.timeout(self.timeout_sec):
                return await operation(client)
        except _BACKEND_ERRORS as exc:
            self._discard(client)
            raise StoreUnavailableError(f"{self!r} failed: {type(exc).__name__}: {exc}") from exc

    def _current_client(self) -> Any:
        if self._client is None:
            host, port = self.endpoints[self._endpoint_index]
            self._client = aetcd.Client(
                host=host, port=port, timeout=self.timeout_sec, connect_wait_timeout=self.timeout_sec
            )
        return self._client

    def _discard(self, client: Any) -> None:
        """Forget a client that failed, so the next call dials again (the next endpoint, if any).

        Only the current client is rotated: when several calls fail together, the first one moves on and the
        others must not skip the endpoint it moved to. The old channel is closed in the background: closing a
        channel to a frozen server must not stretch the failing call past its deadline.
        """
        if self._client is client:
            self._client = None
            self._endpoint_index = (self._endpoint_index + 1) % len(self.endpoints)
        task = asyncio.get_running_loop().create_task(self._close_client(client))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _close_client(self, client: Any) -> None:
        if client is None:
            return
        # Closing cancels the client's other in-flight calls: they were talking to a failing channel anyway.
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.timeout_sec):
                await client.close()


def _read_revision(response: Any) -> int | None:
    """The ``mod_revision`` in a transaction's range response (aetcd gives ``[(value, Get), …]``)."""
    entries = list(response)
    if not entries:
        return None
    _value, found = entries[0]
    return int(found.mod_revision)
