"""The elastic EP keys a simulated rank's worker reads and writes in the group's TCP store.

vLLM 0.34 keeps an external resize's state in the control store of the old world and a reconfiguration store
rank 0 creates per epoch (``distributed/elastic_ep/external_elastic_ep.py`` L218-220 ``key()``, L299-308,
L410-452); its rank 0 also answers new ranks through a temporary ZMQ handshake server (L57-189). The simulator
has one store, the group's (hosted by the worker of the lowest alive rank), so every key of one operation is
namespaced by its epoch and the handshake is a read of the same bootstrap:

- ``current_epoch``: the latest operation's epoch, published after its bootstrap (L447-451);
- ``{epoch}/bootstrap``: ``{"cur", "new", "num_redundant_experts", "slots_per_rank"}``; ``{epoch}/prepared``;
- ``{epoch}/ready/{r}`` for ``r`` in ``range(new)`` (L493 ``eep_ready/{rank}``);
- ``{epoch}/commit_ready/{r}`` for the old ranks (L635-640), ``{epoch}/finished/{r}`` (L565-577),
  ``{epoch}/completed`` (L828-830), ``{epoch}/error`` (L607-619).

Every call has a deadline (:class:`~heteroflow.engine_sim.collectives.BoundedStore`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from heteroflow.engine_sim.collectives import BoundedStore

PREFIX = "elastic_ep/external"


def key(*parts: str | int) -> str:
    """A key of the elastic EP namespace (vLLM's ``ExternalElasticEPScaleCoordinator.key``, L218-220)."""
    return "/".join([PREFIX, *(str(p) for p in parts)])


@dataclass(frozen=True, slots=True)
class Bootstrap:
    """What rank 0 publishes for an operation; a scale-up-launched rank takes its layout from it (vLLM's
    handshake metadata, ``external_elastic_ep.py`` L50-54, L154-179)."""

    cur: int
    new: int
    num_redundant_experts: int
    slots_per_rank: int

    def wire(self) -> str:
        return json.dumps(
            {
                "cur": self.cur,
                "new": self.new,
                "num_redundant_experts": self.num_redundant_experts,
                "slots_per_rank": self.slots_per_rank,
            }
        )

    @classmethod
    def parse(cls, text: str) -> Bootstrap:
        raw = json.loads(text)
        return cls(
            cur=int(raw["cur"]),
            new=int(raw["new"]),
            num_redundant_experts=int(raw["num_redundant_experts"]),
            slots_per_rank=int(raw["slots_per_rank"]),
        )


@dataclass(frozen=True, slots=True)
class Published:
    """The operation ``current_epoch`` names, as the store holds it now."""

    epoch: str
    bootstrap: Bootstrap | None
    prepared: bool
    completed: bool
    error: str | None


class ElasticStore:
    """Reads and writes of the elastic EP keys, each within ``timeout`` seconds."""

    def __init__(self, store: BoundedStore, *, timeout: float) -> None:
        self.store = store
        self.timeout = timeout

    def _has(self, name: str) -> bool:
        return self.store.check([name], timeout=self.timeout)

    def current(self) -> Published | None:
        """The latest operation, or ``None`` before any."""
        if not self._has(key("current_epoch")):
            return None
        epoch = self.store.get(key("current_epoch"), timeout=self.timeout)
        bootstrap = None
        if self._has(key(epoch, "bootstrap")):
            bootstrap = Bootstrap.parse(self.store.get(key(epoch, "bootstrap"), timeout=self.timeout))
        return Published(
            epoch=epoch,
            bootstrap=bootstrap,
            prepared=self._has(key(epoch, "prepared")),
            completed=self._has(key(epoch, "completed")),
            error=self.error(epoch),
        )

    def publish(self, epoch: str, bootstrap: Bootstrap) -> None:
        """Rank 0: the bootstrap, then the epoch (readers never see an epoch without its metadata), then
        ``prepared`` (``external_elastic_ep.py`` L442-452, L716)."""
        self.store.set(key(epoch, "bootstrap"), bootstrap.wire(), timeout=self.timeout)
        self.store.set(key("current_epoch"), epoch, timeout=self.timeout)
        self.store.set(key(epoch, "prepared"), "1", timeout=self.timeout)

    def error(self, epoch: str) -> str | None:
        if not self._has(key(epoch, "error")):
            return None
        return self.store.get(key(epoch, "error"), timeout=self.timeout)

    def publish_error(self, epoch: str, message: str) -> None:
        """The operation failed; the first error stays (vLLM overwrites it with each failing rank's own)."""
        if self.error(epoch) is None:
            self.store.set(key(epoch, "error"), message, timeout=self.timeout)

    def mark(self, epoch: str, what: str, rank: int | None = None) -> None:
        name = key(epoch, what) if rank is None else key(epoch, what, rank)
        self.store.set(name, "1", timeout=self.timeout)

    def all_marked(self, epoch: str, what: str, ranks: range) -> bool:
        return self.store.check([key(epoch, what, r) for r in ranks], timeout=self.timeout)
