"""Active/standby controllers on one etcd: only the holder of the leader lease acts (``docs/controller.md``).

Every controller process of a cluster campaigns for one key (``<prefix>leader``, next to the runtimes) holding its
*claim* — its id, the URL peers reach it at and a nonce — put under an etcd lease of ``ttl_sec``, and only if no
one holds the key. The winner renews the lease every third of its TTL; the others poll the key and claim it as
soon as it is gone. A leader that dies stops renewing, etcd deletes the key when the lease runs out, and a standby
takes over within about one TTL (plus one poll).

What a controller does with leadership (``cli/controller.py``): nothing before it wins — its HTTP API answers
``503 not_leader`` on every route that would act or report state, and ``/ready`` is 503 so a Kubernetes Service
sends no traffic to it. Once it wins it fences the store (every runtime write also requires the leader key to
still hold its claim), loads the persisted runtimes and starts, exactly as a restarted single controller does: a
round that was in flight on the old leader becomes RECONFIGURING with its fallback, never a replayed apply.

Losing leadership is not survivable in place: the controller's in-memory state may be behind what a new leader
did. When a renewal says the lease is gone, or renewals have failed for so long that the lease may have expired
(the time the last successful renewal was *sent* plus the TTL, less a safety margin), :class:`LeaderElection`
calls ``on_lost`` and the process exits; a supervisor restarts it as a standby. A write made in between fails on
the fence (``NotLeaderError``) and changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

import structlog

from heteroflow.core.clock import Clock
from heteroflow.core.errors import StoreUnavailableError

_log = structlog.get_logger(__name__)

LEADERSHIP_LOST_EXIT_CODE = 75
"""The controller's exit code when it lost its lease (EX_TEMPFAIL: restart it, and it comes back as a standby)."""

Role = Literal["standby", "leader", "lost"]


class LeaseStore(Protocol):
    """What the election needs of the store (``EtcdFtRuntimeStore`` implements it)."""

    def fence(self, key: str, claim: bytes | None) -> None: ...

    async def grant_lease(self, ttl_sec: int) -> tuple[int, int]: ...

    async def claim(self, key: str, claim: bytes, lease_id: int) -> bytes | None: ...

    async def read_claim(self, key: str) -> bytes | None: ...

    async def keep_alive(self, lease_id: int) -> int: ...

    async def revoke_lease(self, lease_id: int) -> None: ...


@dataclass(frozen=True, slots=True)
class Claim:
    """Who holds (or wants) the leader key."""

    controller_id: str
    url: str | None
    nonce: str

    def encode(self) -> bytes:
        return json.dumps({"id": self.controller_id, "url": self.url, "nonce": self.nonce}, sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Claim | None:
        """``None`` for bytes that are not a claim (the key was written by something else)."""
        try:
            found = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(found, dict) or not isinstance(found.get("id"), str):
            return None
        url = found.get("url")
        return cls(found["id"], url if isinstance(url, str) else None, str(found.get("nonce", "")))


class LeaderElection:
    """One controller's side of the election; :meth:`campaign` returns once it leads."""

    def __init__(
        self,
        store: LeaseStore,
        *,
        key: str,
        controller_id: str,
        url: str | None,
        ttl_sec: int,
        clock: Clock,
        on_lost: Callable[[str], None],
    ) -> None:
        if ttl_sec < 2:
            raise ValueError(f"the leader lease TTL must be at least 2 s, not {ttl_sec}")
        self.store = store
        self.key = key
        self.claim = Claim(controller_id, url, uuid.uuid4().hex)
        self.ttl_sec = ttl_sec
        self.clock = clock
        self._on_lost = on_lost
        self.role: Role = "standby"
        self.holder: Claim | None = None
        """The leader as last seen (this controller once it leads)."""
        self.lease_id: int | None = None
        self.last_error: str | None = None
        self.became_leader_at: float | None = None
        self._keeper: asyncio.Task[None] | None = None

    @property
    def poll_sec(self) -> float:
        """How often a standby looks at the key."""
        return min(0.5, self.ttl_sec / 4)

    @property
    def renew_sec(self) -> float:
        return self.ttl_sec / 3

    @property
    def leading(self) -> bool:
        return self.role == "leader"

    def status(self) -> dict[str, object]:
        holder = self.holder
        return {
            "role": self.role,
            "controller_id": self.claim.controller_id,
            "leader_id": None if holder is None else holder.controller_id,
            "leader_url": None if holder is None else holder.url,
            "lease_ttl_sec": self.ttl_sec,
            "last_error": self.last_error,
        }

    async def campaign(self) -> None:
        """Return once this controller holds the leader key, and keep renewing it in the background."""
        while True:
            try:
                if await self._try_claim():
                    break
            except StoreUnavailableError as exc:
                self._note_error(f"campaign: {exc}")
            await self.clock.sleep(self.poll_sec)
        self.role = "leader"
        self.holder = self.claim
        self.became_leader_at = self.clock.monotonic()
        self.store.fence(self.key, self.claim.encode())
        _log.info("controller.leadership_acquired", controller_id=self.claim.controller_id, lease_ttl_sec=self.ttl_sec)
        self._keeper = asyncio.create_task(self._keep(), name="leader-lease")

    async def _try_claim(self) -> bool:
        if self.lease_id is None:
            self.lease_id, granted = await self.store.grant_lease(self.ttl_sec)
            self.ttl_sec = max(self.ttl_sec, granted)
        else:
            # the lease from an earlier attempt must still be alive to be put under the key
            if await self.store.keep_alive(self.lease_id) <= 0:
                self.lease_id = None
                return False
        holder = await self.store.claim(self.key, self.claim.encode(), self.lease_id)
        if holder is None or holder == self.claim.encode():  # ours: an earlier claim landed, its answer was lost
            return True
        seen = Claim.decode(holder)
        if seen != self.holder:
            _log.info(
                "controller.standby",
                controller_id=self.claim.controller_id,
                leader_id=None if seen is None else seen.controller_id,
                leader_url=None if seen is None else seen.url,
            )
        self.holder = seen
        return False

    async def _keep(self) -> None:
        lease_id = self.lease_id
        assert lease_id is not None
        margin = min(1.0, self.ttl_sec / 6)
        valid_until = self.clock.monotonic() + self.ttl_sec - margin
        while True:
            # the next renewal, or the moment the lease may have run out if that comes first (renewals failing)
            await self.clock.sleep(min(self.renew_sec, valid_until - self.clock.monotonic()))
            if self.clock.monotonic() >= valid_until:
                self._lose("the leader lease could not be renewed before it may have expired")
                return
            sent = self.clock.monotonic()
            try:
                remaining = await self.store.keep_alive(lease_id)
            except StoreUnavailableError as exc:
                self._note_error(f"renewal: {exc}")
                if self.clock.monotonic() >= valid_until:
                    self._lose("the leader lease could not be renewed before it may have expired")
                    return
                continue
            if remaining <= 0:
                self._lose("etcd says the leader lease is gone")
                return
            valid_until = sent + self.ttl_sec - margin
            try:
                holder = await self.store.read_claim(self.key)
            except StoreUnavailableError as exc:
                self._note_error(f"leader key read: {exc}")
                continue
            if holder != self.claim.encode():  # the key was deleted or overwritten behind our back
                self._lose("the leader key no longer holds this controller's claim")
                return
            self.last_error = None

    def lost(self, reason: str) -> None:
        """Another path (a fenced write) found this controller no longer leads."""
        if self.role == "leader":
            self._lose(reason)

    def _lose(self, reason: str) -> None:
        self.role = "lost"
        self.store.fence(self.key, self.claim.encode())  # keep the fence: every further write must fail
        _log.error("controller.leadership_lost", controller_id=self.claim.controller_id, reason=reason)
        self._on_lost(reason)

    async def resign(self) -> None:
        """Stop renewing and revoke the lease (a clean shutdown): a standby takes over at its next poll."""
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
        lease_id, self.lease_id = self.lease_id, None
        if lease_id is not None and self.role == "leader":
            with contextlib.suppress(StoreUnavailableError):
                await self.store.revoke_lease(lease_id)
            _log.info("controller.leadership_resigned", controller_id=self.claim.controller_id)
        self.role = "standby" if self.role == "leader" else self.role

    def _note_error(self, error: str) -> None:
        if error != self.last_error:
            _log.warning("controller.leadership_store_error", error=error)
        self.last_error = error
