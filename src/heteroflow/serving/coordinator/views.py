"""The published serving views, endpoint selection and the publication signal (``serving-ft.md`` F-40, F-41).
No I/O.

One lock guards the views, the in-flight counts and the dispatch leases, so that a view change and an endpoint
selection are atomic with respect to each other: once :meth:`ServingViews.delete` (or a SET or ADD that drops
or moves an endpoint) has returned, no lease can be granted for the withdrawn endpoint, and no lease granted
earlier can start sending to it (:meth:`ServingViews.begin_send` refuses it).

A lease walks ``SELECTED → SENDING → SENT`` and is then released. Only the ``SENDING`` step — from the check
right before the request headers are written until they are written — can overlap a withdrawal; the change
names those leases (:attr:`ViewChange.sending`) so that the caller can wait the few microseconds it takes
before it reports the withdrawal as done. A lease withdrawn while still ``SELECTED`` never reaches the wire.

:class:`PublicationSignal` wakes the requests held for a publication (its one ``asyncio.Event`` belongs to the
OpenAI listener's loop).

Operations (the controller sends them, ``wire.py``):

- DEL withdraws endpoint ids from an instance's view. Always applied: a withdrawal is never refused; ids that
  are not published are ignored (idempotent, safe to repeat). A DEL may carry a ``generation``: the ids it
  names are then *held back* from every later ADD or SET of no newer generation (one sent before the DEL and
  delivered after it cannot publish them again); an ADD or SET of a newer generation lifts the hold.
- ADD merges endpoints into the view (an id already there takes the new address).
- SET replaces the instance's whole view (model and endpoints).
- ADD and SET carry a ``generation``; one older than the last applied for the instance is ignored and reported
  (:attr:`ViewOutcome.STALE_GENERATION`), so a late periodic refresh never undoes a newer view. Equal
  generations apply (the default generation is 0 everywhere).

Fault answers (:meth:`ServingViews.suspect`): an endpoint whose engine just answered with a fault is skipped by
every selection for a short while, or until it is published again, whichever comes first; each key counts its
publications (:meth:`ServingViews.epoch`) so that "published again" is a comparison, not a timer.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import re
import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from heteroflow.contracts.serving import PublishedInstance, ServingEndpoint, ViewAddRequest, ViewDelRequest

_HOSTNAME = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)


def valid_host(text: str) -> bool:
    """An IP literal or a DNS name: anything else could smuggle a path or a userinfo into the upstream URL."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return _HOSTNAME.fullmatch(text) is not None
    return True


@dataclass(frozen=True, slots=True, order=True)
class EndpointKey:
    """One published endpoint at one address; a moved endpoint (same id, new address) is a new key."""

    instance_id: str
    endpoint_id: int
    ip: str
    port: int

    @property
    def base_url(self) -> str:
        host = f"[{self.ip}]" if ":" in self.ip and not self.ip.startswith("[") else self.ip
        return f"http://{host}:{self.port}"

    @property
    def label(self) -> str:
        return f"{self.instance_id}/{self.endpoint_id}"


@dataclass(frozen=True, slots=True)
class InstanceView:
    """What one instance publishes: its model, its endpoints (sorted by id) and the last applied generation."""

    instance_id: str
    model: str
    endpoints: tuple[ServingEndpoint, ...]
    generation: int

    def endpoint_keys(self) -> frozenset[EndpointKey]:
        return frozenset(EndpointKey(self.instance_id, e.id, e.ip, e.port) for e in self.endpoints)

    def wire(self) -> PublishedInstance:
        return PublishedInstance(
            instance_id=self.instance_id, model=self.model, endpoints=list(self.endpoints), generation=self.generation
        )


class ViewOutcome(StrEnum):
    APPLIED = "applied"
    STALE_GENERATION = "stale_generation"
    """ADD/SET older than the instance's last applied generation: ignored, the view is unchanged."""
    UNKNOWN_INSTANCE = "unknown_instance"
    """DEL for an instance never published: nothing to withdraw."""


class LeaseState(StrEnum):
    SELECTED = "selected"
    SENDING = "sending"
    SENT = "sent"
    RELEASED = "released"


@dataclass(eq=False, slots=True)
class Lease:
    """The right to send one upstream request to ``key``; counted in flight until released."""

    key: EndpointKey
    model: str
    state: LeaseState = LeaseState.SELECTED


@dataclass(frozen=True, slots=True)
class ViewChange:
    """The result of one management operation."""

    outcome: ViewOutcome
    instances: tuple[InstanceView, ...]
    """Every view after the operation, sorted by instance id."""
    withdrawn: frozenset[EndpointKey] = frozenset()
    """Keys that were published before the operation and are not any more."""
    published: frozenset[EndpointKey] = frozenset()
    """Keys that were not published before the operation and are now."""
    sending: tuple[Lease, ...] = ()
    """Leases that were writing their request headers to a withdrawn key when the view changed."""
    detail: str = ""


class ModelMismatchError(ValueError):
    """ADD names a model other than the instance's; the whole view must change through SET."""


@dataclass(frozen=True, slots=True)
class ViewsStatus:
    """A consistent snapshot of the views and of the requests in flight per endpoint."""

    instances: tuple[InstanceView, ...]
    in_flight: Mapping[EndpointKey, int] = field(default_factory=dict)
    sending: Mapping[EndpointKey, int] = field(default_factory=dict)
    """Leases writing their request headers right now (normally empty: that lasts microseconds)."""
    generation_refusals: int = 0
    held_back: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    """Per instance: endpoint ids a generation-carrying DEL withdrew, and that generation."""


def choose(
    candidates: Sequence[EndpointKey],
    in_flight: Mapping[EndpointKey, int],
    turn: int,
    *,
    avoid_instances: frozenset[str] = frozenset(),
) -> EndpointKey | None:
    """The candidate with the fewest requests in flight; ties are taken in turn (``turn`` counts selections).

    Purely computational. Least-in-flight keeps a slow or half-recovered engine from piling up requests; the
    round-robin tie-break spreads sequential traffic evenly instead of always hitting the lowest id. A request
    that already met a fault prefers the instances it has not met one on (``avoid_instances``): the ranks of an
    instance fail together, another instance's do not.
    """
    preferred = [key for key in candidates if key.instance_id not in avoid_instances]
    candidates = preferred or list(candidates)
    if not candidates:
        return None
    fewest = min(in_flight.get(key, 0) for key in candidates)
    ties = sorted(key for key in candidates if in_flight.get(key, 0) == fewest)
    return ties[turn % len(ties)]


class ServingViews:
    """The Coordinator's published views; safe to call from any thread or task (one short lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._instances: dict[str, InstanceView] = {}
        self._published: frozenset[EndpointKey] = frozenset()
        self._by_model: dict[str, tuple[EndpointKey, ...]] = {}
        self._in_flight: Counter[EndpointKey] = Counter()
        self._sending: dict[EndpointKey, set[Lease]] = {}
        self._turns: Counter[str] = Counter()
        self._refusals = 0
        self._held: dict[str, dict[int, int]] = {}
        self._epochs: Counter[EndpointKey] = Counter()
        self._suspects: dict[EndpointKey, tuple[float, int]] = {}

    # -- management -------------------------------------------------------------------------------------
    def delete(self, request: ViewDelRequest) -> ViewChange:
        with self._lock:
            current = self._instances.get(request.instance_id)
            if current is None:
                return ViewChange(
                    ViewOutcome.UNKNOWN_INSTANCE,
                    self._sorted(),
                    detail=f"instance {request.instance_id!r} publishes nothing",
                )
            ids = set(request.endpoint_ids)
            if request.generation is not None:
                held = self._held.setdefault(request.instance_id, {})
                for eid in ids:
                    held[eid] = max(held.get(eid, 0), request.generation)
            kept = tuple(e for e in current.endpoints if e.id not in ids)
            absent = sorted(ids - {e.id for e in current.endpoints})
            detail = f"not published (ignored): {absent}" if absent else ""
            return self._install(
                InstanceView(current.instance_id, current.model, kept, current.generation), detail=detail
            )

    def add(self, request: ViewAddRequest) -> ViewChange:
        """Merge ``request.endpoints`` into the view; raises :class:`ModelMismatchError` for another model."""
        with self._lock:
            current = self._instances.get(request.instance_id)
            if current is not None and request.generation < current.generation:
                return self._stale(current, request)
            if current is not None and current.model != request.model:
                raise ModelMismatchError(
                    f"instance {request.instance_id!r} serves {current.model!r}, the ADD names {request.model!r}; "
                    "change an instance's model with SET"
                )
            given, detail = self._lift_or_hold(request)
            merged = {e.id: e for e in (current.endpoints if current is not None else ())}
            merged.update({e.id: e for e in given})
            endpoints = tuple(merged[eid] for eid in sorted(merged))
            view = InstanceView(request.instance_id, request.model, endpoints, request.generation)
            return self._install(view, detail=detail)

    def replace(self, request: ViewAddRequest) -> ViewChange:
        """SET: the instance's whole view becomes ``request`` (model included)."""
        with self._lock:
            current = self._instances.get(request.instance_id)
            if current is not None and request.generation < current.generation:
                return self._stale(current, request)
            given, detail = self._lift_or_hold(request)
            endpoints = tuple(sorted(given, key=lambda e: e.id))
            view = InstanceView(request.instance_id, request.model, endpoints, request.generation)
            return self._install(view, detail=detail)

    # -- routing ----------------------------------------------------------------------------------------
    def models(self) -> list[str]:
        """Every model with at least one known instance, published endpoints or not."""
        with self._lock:
            return sorted(self._by_model)

    def is_known(self, model: str) -> bool:
        with self._lock:
            return model in self._by_model

    def acquire(
        self,
        model: str,
        *,
        exclude: Iterable[EndpointKey] = (),
        avoid_instances: frozenset[str] = frozenset(),
        now: float | None = None,
    ) -> Lease | None:
        """A lease on the best published endpoint serving ``model`` (see :func:`choose`), or ``None``.

        Endpoints suspected at ``now`` (:meth:`suspect`) are skipped. Only first choices (nothing excluded)
        take a turn: if retries took turns too, a dead endpoint would be every request's first choice (its
        failure and the retry elsewhere would always use two turns).
        """
        excluded = frozenset(exclude)
        with self._lock:
            candidates = [
                key
                for key in self._by_model.get(model, ())
                if key not in excluded and (now is None or not self._suspected(key, now))
            ]
            key = choose(candidates, self._in_flight, self._turns[model], avoid_instances=avoid_instances)
            if key is None:
                return None
            if not excluded:
                self._turns[model] += 1
            self._in_flight[key] += 1
            return Lease(key=key, model=model)

    def epoch(self, key: EndpointKey) -> int:
        """How many times ``key`` has become published (a withdrawn and re-published endpoint counts anew)."""
        with self._lock:
            return self._epochs[key]

    def suspect(self, key: EndpointKey, *, until: float) -> None:
        """Skip ``key`` in every selection until ``until`` (the caller's clock), or until it is published again."""
        with self._lock:
            self._suspects[key] = (until, self._epochs[key])

    def next_suspect_expiry(self, model: str, now: float) -> float | None:
        """The earliest time a suspected endpoint of ``model`` becomes a candidate again (``None``: none)."""
        with self._lock:
            times = [
                until
                for key in self._by_model.get(model, ())
                if (found := self._suspects.get(key)) is not None
                and (until := found[0]) > now
                and found[1] == self._epochs[key]
            ]
            return min(times, default=None)

    def is_published(self, key: EndpointKey) -> bool:
        with self._lock:
            return key in self._published

    def begin_send(self, lease: Lease) -> bool:
        """Called right before the request headers are written: ``False`` if the endpoint was withdrawn."""
        with self._lock:
            if lease.state is not LeaseState.SELECTED or lease.key not in self._published:
                return False
            lease.state = LeaseState.SENDING
            self._sending.setdefault(lease.key, set()).add(lease)
            return True

    def mark_sent(self, lease: Lease) -> None:
        """The request headers were written (or writing them failed): the lease no longer races a withdrawal."""
        with self._lock:
            if lease.state is LeaseState.SENDING:
                lease.state = LeaseState.SENT
                self._forget_sending(lease)

    def still_sending(self, leases: Iterable[Lease]) -> bool:
        """Whether any of these leases is still writing its request headers (for a waiter on another loop)."""
        with self._lock:
            return any(lease.state is LeaseState.SENDING for lease in leases)

    def release(self, lease: Lease) -> None:
        """The upstream request is over (answered, failed or abandoned); idempotent."""
        with self._lock:
            if lease.state is LeaseState.RELEASED:
                return
            if lease.state is LeaseState.SENDING:
                self._forget_sending(lease)
            lease.state = LeaseState.RELEASED
            self._in_flight[lease.key] -= 1
            if self._in_flight[lease.key] <= 0:
                del self._in_flight[lease.key]

    def status(self) -> ViewsStatus:
        with self._lock:
            sending = {key: len(leases) for key, leases in self._sending.items()}
            held = {iid: dict(ids) for iid, ids in self._held.items() if ids}
            return ViewsStatus(self._sorted(), dict(self._in_flight), sending, self._refusals, held)

    def snapshot(self) -> tuple[InstanceView, ...]:
        with self._lock:
            return self._sorted()

    # -- internals (lock held) --------------------------------------------------------------------------
    def _sorted(self) -> tuple[InstanceView, ...]:
        return tuple(self._instances[iid] for iid in sorted(self._instances))

    def _suspected(self, key: EndpointKey, now: float) -> bool:
        found = self._suspects.get(key)
        if found is None:
            return False
        until, epoch = found
        if until <= now or epoch != self._epochs[key]:
            del self._suspects[key]
            return False
        return True

    def _lift_or_hold(self, request: ViewAddRequest) -> tuple[list[ServingEndpoint], str]:
        """The endpoints of an ADD/SET that may be published: a newer generation lifts a DEL's hold, an older
        or equal one leaves the held ids out."""
        held = self._held.get(request.instance_id)
        if not held:
            return list(request.endpoints), ""
        kept, withheld = [], []
        for endpoint in request.endpoints:
            since = held.get(endpoint.id)
            if since is None:
                kept.append(endpoint)
            elif request.generation > since:
                del held[endpoint.id]
                kept.append(endpoint)
            else:
                withheld.append(endpoint.id)
        if not withheld:
            return kept, ""
        generations = sorted({held[eid] for eid in withheld})
        return kept, (
            f"endpoints {sorted(withheld)} left out: withdrawn by a DEL at generation {generations[-1]}, "
            f"not newer than this one's {request.generation}"
        )

    def _stale(self, current: InstanceView, request: ViewAddRequest) -> ViewChange:
        self._refusals += 1
        return ViewChange(
            ViewOutcome.STALE_GENERATION,
            self._sorted(),
            detail=(
                f"generation {request.generation} is older than the applied generation {current.generation} "
                f"of instance {current.instance_id!r}; ignored"
            ),
        )

    def _install(self, view: InstanceView, *, detail: str = "") -> ViewChange:
        before = self._published
        self._instances[view.instance_id] = view
        self._published = frozenset(key for v in self._instances.values() for key in v.endpoint_keys())
        by_model: dict[str, list[EndpointKey]] = {}
        for v in self._instances.values():
            by_model.setdefault(v.model, []).extend(v.endpoint_keys())
        self._by_model = {model: tuple(sorted(keys)) for model, keys in by_model.items()}
        withdrawn = before - self._published
        for key in self._published - before:
            self._epochs[key] += 1
        sending = tuple(lease for key in sorted(withdrawn) for lease in self._sending.get(key, ()))
        return ViewChange(
            ViewOutcome.APPLIED,
            self._sorted(),
            withdrawn=withdrawn,
            published=self._published - before,
            sending=sending,
            detail=detail,
        )

    def _forget_sending(self, lease: Lease) -> None:
        leases = self._sending.get(lease.key)
        if leases is not None:
            leases.discard(lease)
            if not leases:
                del self._sending[lease.key]


class PublicationSignal:
    """Wakes the requests that wait for a publication; take :meth:`current` before looking at the views."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._waiting = 0

    @property
    def waiting(self) -> int:
        """Requests waiting now for a publication (their model has no published endpoint)."""
        return self._waiting

    def current(self) -> asyncio.Event:
        return self._event

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, seen: asyncio.Event, *, within: float) -> None:
        """Return at the first publication after ``seen`` was taken, or after ``within`` seconds."""
        self._waiting += 1
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(within):
                    await seen.wait()
        finally:
            self._waiting -= 1
