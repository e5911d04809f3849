"""Published views: DEL / ADD / SET, generations, leases and endpoint choice (F-40, F-41)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from heteroflow.contracts.serving import ViewAddRequest, ViewDelRequest
from heteroflow.serving.coordinator.views import (
    EndpointKey,
    Lease,
    LeaseState,
    ModelMismatchError,
    ServingViews,
    ViewOutcome,
    choose,
    valid_host,
)


def endpoints(*ids: int, port: int = 8000) -> list[dict[str, Any]]:
    return [{"id": i, "ip": f"10.0.0.{i + 1}", "port": port} for i in ids]


def view_add(instance: str, ids: tuple[int, ...], *, model: str = "m", generation: int = 0, port: int = 8000) -> Any:
    return ViewAddRequest.model_validate(
        {"instance_id": instance, "model": model, "endpoints": endpoints(*ids, port=port), "generation": generation}
    )


def view_del(instance: str, ids: tuple[int, ...]) -> ViewDelRequest:
    return ViewDelRequest(instance_id=instance, endpoint_ids=list(ids))


def published_ids(views: ServingViews, instance: str) -> list[int]:
    for view in views.snapshot():
        if view.instance_id == instance:
            return [e.id for e in view.endpoints]
    raise KeyError(instance)


def state_of(lease: Lease) -> LeaseState:
    return lease.state


def drain(views: ServingViews, model: str = "m") -> list[Lease]:
    """Every lease the views grant for ``model`` right now, one per endpoint at most (excluding each)."""
    leases: list[Lease] = []
    while (lease := views.acquire(model, exclude=[le.key for le in leases])) is not None:
        leases.append(lease)
    return leases


# -- operations ----------------------------------------------------------------------------------------------
def test_set_replaces_the_whole_view_and_reports_what_changed() -> None:
    views = ServingViews()
    first = views.replace(view_add("i1", (0, 1, 2)))
    assert first.outcome is ViewOutcome.APPLIED
    assert {k.endpoint_id for k in first.published} == {0, 1, 2}
    second = views.replace(view_add("i1", (1, 3), generation=1))
    assert published_ids(views, "i1") == [1, 3]
    assert {k.endpoint_id for k in second.withdrawn} == {0, 2}
    assert {k.endpoint_id for k in second.published} == {3}


def test_add_merges_and_a_moved_endpoint_withdraws_its_old_address() -> None:
    views = ServingViews()
    views.replace(view_add("i1", (0, 1)))
    change = views.add(view_add("i1", (1, 2), port=9000))
    assert published_ids(views, "i1") == [0, 1, 2]
    assert [(k.endpoint_id, k.port) for k in change.withdrawn] == [(1, 8000)]
    assert sorted((k.endpoint_id, k.port) for k in change.published) == [(1, 9000), (2, 9000)]


def test_add_creates_an_unknown_instance() -> None:
    views = ServingViews()
    views.add(view_add("new", (4,), model="other", generation=3))
    assert published_ids(views, "new") == [4]
    assert views.snapshot()[0].generation == 3


def test_del_withdraws_ids_and_ignores_unpublished_ones() -> None:
    views = ServingViews()
    views.replace(view_add("i1", (0, 1, 2)))
    change = views.delete(view_del("i1", (1, 7)))
    assert change.outcome is ViewOutcome.APPLIED
    assert published_ids(views, "i1") == [0, 2]
    assert "7" in change.detail
    again = views.delete(view_del("i1", (1,)))  # idempotent: a repeated DEL is harmless
    assert again.outcome is ViewOutcome.APPLIED
    assert not again.withdrawn


def test_del_of_an_unknown_instance_changes_nothing() -> None:
    views = ServingViews()
    change = views.delete(view_del("ghost", (0,)))
    assert change.outcome is ViewOutcome.UNKNOWN_INSTANCE
    assert views.snapshot() == ()


def test_an_emptied_instance_keeps_its_model_known() -> None:
    views = ServingViews()
    views.replace(view_add("i1", (0,), model="llama"))
    views.delete(view_del("i1", (0,)))
    assert views.models() == ["llama"]
    assert views.is_known("llama")
    assert views.acquire("llama") is None
    assert not views.is_known("other")


@pytest.mark.parametrize("op", ["add", "replace"])
def test_an_older_generation_is_ignored_and_reported(op: str) -> None:
    views = ServingViews()
    views.replace(view_add("i1", (0, 1), generation=5))
    change = getattr(views, op)(view_add("i1", (0, 1, 2, 3), generation=4))
    assert change.outcome is ViewOutcome.STALE_GENERATION
    assert "older" in change.detail
    assert published_ids(views, "i1") == [0, 1]
    assert views.status().generation_refusals == 1


@pytest.mark.parametrize("op", ["add", "replace"])
def test_equal_and_newer_generations_apply(op: str) -> None:
    views = ServingViews()
    views.replace(view_add("i1", (0,), generation=5))
    assert getattr(views, op)(view_add("i1", (1,), generation=5)).outcome is ViewOutcome.APPLIED
    assert getattr(views, op)(view_add("i1", (2,), generation=6)).outcome is ViewOutcome.APPLIED
    assert views.snapshot()[0].generation == 6


def test_del_keeps_the_generation() -> None:
    views = ServingViews()
    views.replace(view_add("i1", (0, 1), generation=2))
    views.delete(view_del("i1", (0,)))
    assert views.snapshot()[0].generation == 2
    assert views.add(view_add("i1", (0,), generation=1)).outcome is ViewOutcome.STALE_GENERATION


def test_add_with_another_model_is_refused_but_set_may_change_it() -> None:
    views = ServingViews()
    views.replace(view_add("i1", (0,), model="a"))
    with pytest.raises(ModelMismatchError):
        views.add(view_add("i1", (1,), model="b"))
    views.replace(view_add("i1", (1,), model="b"))
    assert views.models() == ["b"]


# -- leases ------------------------------------------------------------------------------------------------
def test_a_withdrawn_endpoint_is_never_chosen_again() -> None:
    views = ServingViews()
    views.replace(view_add("i1", (0, 1, 2)))
    views.delete(view_del("i1", (1,)))
    for _ in range(9):
        lease = views.acquire("m")
        assert lease is not None
        assert lease.key.endpoint_id != 1
        views.release(lease)


def test_a_lease_chosen_before_the_withdrawal_cannot_start_sending() -> None:
    views = ServingViews()
    views.replace(view_add("i1", (0,)))
    lease = views.acquire("m")
    assert lease is not None
    change = views.delete(view_del("i1", (0,)))
    assert change.sending == ()  # it had not started: nothing to wait for
    assert not views.begin_send(lease)
    views.release(lease)
    assert views.status().in_flight == {}


def test_a_lease_writing_its_headers_is_named_by_the_withdrawal() -> None:
    views = ServingViews()
    views.replace(view_add("i1", (0, 1)))
    lease = views.acquire("m")
    assert lease is not None
    assert views.begin_send(lease)
    assert lease.state is LeaseState.SENDING
    change = views.replace(view_add("i1", (1 - lease.key.endpoint_id,), generation=1))
    assert change.sending == (lease,)
    views.mark_sent(lease)
    assert state_of(lease) is LeaseState.SENT  # read anew: mypy keeps the state narrowed to SENDING
    assert views.status().sending == {}
    views.release(lease)
    views.release(lease)  # idempotent
    assert views.status().in_flight == {}


def test_a_moved_endpoint_refuses_a_lease_on_its_old_address() -> None:
    views = ServingViews()
    views.replace(view_add("i1", (0,)))
    lease = views.acquire("m")
    assert lease is not None
    views.add(view_add("i1", (0,), port=9000))
    assert not views.begin_send(lease)
    fresh = views.acquire("m")
    assert fresh is not None
    assert fresh.key.port == 9000


# -- balancing ---------------------------------------------------------------------------------------------
def key(endpoint_id: int, instance: str = "i1") -> EndpointKey:
    return EndpointKey(instance, endpoint_id, f"10.0.0.{endpoint_id + 1}", 8000)


def test_choose_takes_the_least_loaded_endpoint() -> None:
    candidates = [key(0), key(1), key(2)]
    assert choose(candidates, {key(0): 2, key(1): 1, key(2): 3}, turn=0) == key(1)
    assert choose(candidates, {key(0): 2, key(1): 1, key(2): 3}, turn=7) == key(1)


def test_choose_breaks_ties_in_turn() -> None:
    candidates = [key(2), key(0), key(1)]
    picks = [choose(candidates, {key(1): 1}, turn=t) for t in range(4)]
    assert picks == [key(0), key(2), key(0), key(2)]
    assert choose([], {}, turn=0) is None


def test_sequential_traffic_is_spread_evenly_over_instances_of_a_model() -> None:
    views = ServingViews()
    views.replace(view_add("i1", (0, 1)))
    views.replace(view_add("i2", (0,), port=9000))
    views.replace(view_add("other", (5,), model="x"))
    seen: list[str] = []
    for _ in range(9):
        lease = views.acquire("m")
        assert lease is not None
        seen.append(lease.key.label)
        views.release(lease)
    assert sorted(seen) == sorted(["i1/0", "i1/1", "i2/0"] * 3)


def test_concurrent_traffic_goes_to_the_least_loaded_and_exclusion_is_honoured() -> None:
    views = ServingViews()
    views.replace(view_add("i1", (0, 1, 2)))
    held = drain(views)
    assert sorted(lease.key.endpoint_id for lease in held) == [0, 1, 2]
    busy = next(lease for lease in held if lease.key.endpoint_id == 0)
    for other in held:
        if other is not busy:
            views.release(other)
    for _ in range(4):  # 0 is busy and 2 excluded: only 1 is left, every time
        lease = views.acquire("m", exclude=[key(2)])
        assert lease is not None
        assert lease.key.endpoint_id == 1
        views.release(lease)
    assert views.status().in_flight == {busy.key: 1}


# -- stateful: a withdrawn id is never selectable until re-added ----------------------------------------------
IDS = st.frozensets(st.integers(min_value=0, max_value=3), max_size=4)
INSTANCES = st.sampled_from(["a", "b"])


class ViewsMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.views = ServingViews()
        self.expected: dict[str, set[int]] = {}
        self.generation: dict[str, int] = {}
        self.leases: list[Lease] = []

    def _published(self) -> set[tuple[str, int]]:
        return {(inst, eid) for inst, ids in self.expected.items() for eid in ids}

    @rule(instance=INSTANCES, ids=IDS, generation=st.integers(min_value=0, max_value=6))
    def set_view(self, instance: str, ids: frozenset[int], generation: int) -> None:
        change = self.views.replace(view_add(instance, tuple(sorted(ids)), generation=generation))
        if generation >= self.generation.get(instance, 0):
            self.expected[instance] = set(ids)
            self.generation[instance] = generation
            assert change.outcome is ViewOutcome.APPLIED
        else:
            assert change.outcome is ViewOutcome.STALE_GENERATION

    @rule(instance=INSTANCES, ids=IDS, generation=st.integers(min_value=0, max_value=6))
    def add_view(self, instance: str, ids: frozenset[int], generation: int) -> None:
        change = self.views.add(view_add(instance, tuple(sorted(ids)), generation=generation))
        if generation >= self.generation.get(instance, 0):
            self.expected.setdefault(instance, set()).update(ids)
            self.generation[instance] = generation
            assert change.outcome is ViewOutcome.APPLIED
        else:
            assert change.outcome is ViewOutcome.STALE_GENERATION

    @rule(instance=INSTANCES, ids=IDS)
    def delete_view(self, instance: str, ids: frozenset[int]) -> None:
        change = self.views.delete(view_del(instance, tuple(sorted(ids))))
        if instance in self.expected:
            self.expected[instance] -= ids
        # a lease that was writing headers to a withdrawn endpoint is exactly what the change names
        for lease in change.sending:
            assert lease.key in change.withdrawn
            assert lease.state is LeaseState.SENDING

    @rule()
    def choose_one(self) -> None:
        lease = self.views.acquire("m")
        if lease is None:
            assert not self._published()
            return
        assert (lease.key.instance_id, lease.key.endpoint_id) in self._published()
        self.leases.append(lease)

    @precondition(lambda self: bool(self.leases))
    @rule(data=st.data())
    def start_sending(self, data: st.DataObject) -> None:
        lease = data.draw(st.sampled_from(self.leases))
        was_selected = lease.state is LeaseState.SELECTED
        started = self.views.begin_send(lease)
        published = (lease.key.instance_id, lease.key.endpoint_id) in self._published()
        assert started == (was_selected and published)
        if started:
            self.views.mark_sent(lease)

    @precondition(lambda self: bool(self.leases))
    @rule(data=st.data())
    def finish_one(self, data: st.DataObject) -> None:
        lease = data.draw(st.sampled_from(self.leases))
        self.views.release(lease)
        self.leases.remove(lease)

    @invariant()
    def views_match_the_model(self) -> None:
        for instance, ids in self.expected.items():
            assert set(published_ids(self.views, instance)) == ids

    @invariant()
    def in_flight_counts_the_open_leases(self) -> None:
        assert sum(self.views.status().in_flight.values()) == len(self.leases)


TestViewsMachine = ViewsMachine.TestCase


@pytest.mark.parametrize(
    ("host", "valid"),
    [
        ("10.0.0.1", True),
        ("::1", True),
        ("engine-0.pods.svc", True),
        ("localhost", True),
        ("10.0.0.1/x", False),
        ("a@b", False),
        ("", False),
        ("-x", False),
        ("a..b", False),
        ("h:80", False),
    ],
)
def test_valid_host(host: str, valid: bool) -> None:
    assert valid_host(host) is valid


def test_an_ipv6_endpoint_gets_brackets_in_its_url() -> None:
    assert EndpointKey("i", 0, "::1", 8000).base_url == "http://[::1]:8000"
