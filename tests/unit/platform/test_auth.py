from __future__ import annotations

import gc

import pytest

from heteroflow.core.ids import TenantId, TokenId
from heteroflow.core.ttl_cache import TtlCache
from heteroflow.platform.auth import (
    InvalidScopeError,
    Principal,
    Scope,
    generate_token,
    hash_token,
    parse_scopes,
)


def test_parse_scopes() -> None:
    assert parse_scopes(" nodes:read, agent ") == {Scope.NODES_READ, Scope.AGENT}
    with pytest.raises(InvalidScopeError, match="unknown scope"):
        parse_scopes("nodes:read,root")
    with pytest.raises(InvalidScopeError, match="at least one"):
        parse_scopes(" , ")


def test_tokens_are_random_and_stored_as_hashes() -> None:
    a, b = generate_token(), generate_token()
    assert a != b
    assert a.startswith("hf_")
    assert len(a) > 40
    assert hash_token(a) != a
    assert hash_token(a) == hash_token(a)
    assert len(hash_token(a)) == 64


def test_admin_implies_every_scope_and_tenants_see_only_their_nodes() -> None:
    admin = Principal(token_id=TokenId("t"), scopes=frozenset({Scope.ADMIN}), tenant_id=None)
    assert all(admin.has(scope) for scope in Scope)
    tenant = Principal(token_id=TokenId("u"), scopes=frozenset({Scope.NODES_READ}), tenant_id=TenantId("a"))
    assert tenant.has(Scope.NODES_READ)
    assert not tenant.has(Scope.NODES_WRITE)
    assert tenant.sees_node(TenantId("a"))
    assert not tenant.sees_node(TenantId("b"))
    assert not tenant.sees_node(None)
    assert admin.sees_node(TenantId("b"))


def test_confirming_a_fleet_of_cached_entries_leaves_nothing_new_for_the_collector() -> None:
    """Every liveness flush confirms every beating node's cache entry: a float per entry, no new object (a pair
    per entry and flush was tens of thousands of objects that each young collection walked)."""
    cache: TtlCache[str, object] = TtlCache(ttl_sec=10, max_entries=10_000)
    values = [object() for _ in range(1_000)]
    for n, value in enumerate(values):
        cache.put(f"node-{n}", value, now=0)
    keys = cache.keys()
    gc.collect()
    gc.disable()  # nothing collected meanwhile: the young generation holds what touching made
    try:
        before = len(gc.get_objects(0))
        cache.touch(keys, now=5)
        made = len(gc.get_objects(0)) - before
    finally:
        gc.enable()
    assert made < 10  # not one per entry (1,000)
    assert cache.get("node-0", now=14) is values[0]  # confirmed at 5: fresh until 15
    assert cache.get("node-0", now=15.1) is None


def test_ttl_cache_freshness_staleness_and_bound() -> None:
    cache: TtlCache[str, int] = TtlCache(ttl_sec=10, max_entries=2)
    cache.put("a", 1, now=0)
    assert cache.get("a", now=10) == 1
    assert cache.get("a", now=10.1) is None
    assert cache.get_stale("a") == 1  # kept for when it cannot be re-confirmed
    cache.touch(["a", "missing"], now=20)
    assert cache.get("a", now=25) == 1
    cache.put("b", 2, now=25)
    cache.put("c", 3, now=25)
    assert cache.keys() == ["b", "c"]
