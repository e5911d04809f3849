"""A tenant sees its own nodes and nothing of another tenant's, on every route of the platform server
(``health.md`` H-80: statistics, capabilities and lists over the tenant's nodes only; a node outside the scope and
a node that does not exist give the identical 404).

Two worlds are seeded the same way for tenant ``alpha``: one also holds tenant ``bravo`` with the same kind of
data, the other does not. Every route is enumerated and classified from its parameters:

- a route that takes a node id (path or query) or an alert id answers ``bravo``'s id exactly as it answers an id
  that names nothing;
- a read without ids answers ``alpha`` in the world with ``bravo`` exactly as in the world without: same items,
  same totals, same statistics, and none of ``bravo``'s names or ids anywhere;
- a route that cannot be classified from its shape is listed in :data:`BY_HAND`, and an unlisted one fails.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from enum import StrEnum
from typing import Any

import pytest
from httpx2 import Response

from tests.security.routes import Endpoint, endpoints
from tests.security.services import MISSING_ID, PATH_VALUES, auth
from tests.security.tenants import T0, Tenant, World, world


class Kind(StrEnum):
    NODE = "takes a node id: another tenant's node is the same 404 as a missing one"
    ALERT = "takes an alert id: another tenant's alert is the same 404 as a missing one"
    COLLECTION = "a read without ids: what the tenant would see if it were alone"
    OWN_TENANT = "creates a node, in the caller's own tenant"
    CLUSTER_WIDE = "data of the whole cluster: refused to every tenant token (403)"
    OWN_SESSION = "starts or ends the caller's own browser session: no other tenant's data"


BY_HAND: dict[str, Kind] = {
    "POST /api/v1/nodes/register": Kind.OWN_TENANT,
    "GET /ui/{path:path}": Kind.COLLECTION,  # a static asset of the web shell: the same for everyone
    "GET /api/v1/serving/rounds/{request_id}": Kind.CLUSTER_WIDE,  # serving instances belong to no tenant
    "POST /api/v1/auth/session": Kind.OWN_SESSION,  # the session has exactly the token's tenant (test_web_sessions)
    "DELETE /api/v1/auth/session": Kind.OWN_SESSION,
}
"""Routes whose tenancy their shape does not tell: anything but a read without path parameters."""

QUERY_VALUES = {"gpu_index": "0"}
"""Values of required query parameters other than ``node_id``."""
COLLECTION_QUERIES = {"/api/v1/hardware-events": {"since": (T0 - timedelta(days=30)).isoformat()}}
"""Reads whose default answer would be empty for everyone (the feed starts 'now' without ``since``)."""
BODIES: dict[str, dict[str, Any]] = {
    "Heartbeat": {"gpu_stats": []},
    "ResolveRequest": {"reason": "checked by hand"},
    "AcknowledgeRequest": {"note": "on it"},
}


def classify(endpoint: Endpoint) -> Kind | None:
    if endpoint.key in BY_HAND:
        return BY_HAND[endpoint.key]
    if "node_id" in endpoint.path_params or endpoint.query_params.get("node_id") is True:
        return Kind.NODE
    if "alert_id" in endpoint.path_params:
        return Kind.ALERT
    if not endpoint.path_params and endpoint.safe:
        return Kind.COLLECTION
    return None


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory, _clean_settings_environment: None) -> Iterator[World]:
    with world(tmp_path_factory.mktemp("alpha-bravo"), ["alpha", "bravo"]) as seeded:
        yield seeded


@pytest.fixture(scope="module")
def alone(tmp_path_factory: pytest.TempPathFactory, _clean_settings_environment: None) -> Iterator[World]:
    with world(tmp_path_factory.mktemp("alpha"), ["alpha"]) as seeded:
        yield seeded


def routes(w: World, kind: Kind) -> list[Endpoint]:
    found = [e for e in endpoints(w.app) if classify(e) is kind]
    assert found or kind is Kind.OWN_TENANT, f"no {kind.name} route enumerated"
    return found


def tenant_tokens(tenant: Tenant) -> dict[str, str]:
    return {"every scope but admin": tenant.member, "admin": tenant.admin}


def call(w: World, endpoint: Endpoint, token: str, *, values: dict[str, str]) -> Response:
    """``endpoint`` with ``values`` (``node_id``, ``alert_id``, ``since`` …) in its path or query, whichever takes
    them, and an example body where it takes one."""
    path_values = PATH_VALUES | {k: v for k, v in values.items() if k in endpoint.path_params}
    query = {k: v for k, v in values.items() if k in endpoint.query_params and k not in endpoint.path_params}
    for name, required in endpoint.query_params.items():
        if required and name not in query:
            assert name in QUERY_VALUES, f"{endpoint.key}: no value for its required query parameter {name!r}"
            query[name] = QUERY_VALUES[name]
    body: dict[str, Any] = {}
    if endpoint.body is not None:
        model = endpoint.body.__name__
        assert model in BODIES, f"{endpoint.key}: no example body for {model}; add one to BODIES"
        body = {"json": BODIES[model]}
    return w.harness.client.request(
        endpoint.method, endpoint.path(path_values), params=query or None, headers=auth(token), **body
    )


def test_every_route_is_classified(both: World) -> None:
    served = endpoints(both.app)
    unclassified = [e.key for e in served if classify(e) is None]
    assert not unclassified, f"routes whose tenancy is unknown; classify them in BY_HAND: {unclassified}"
    stale = set(BY_HAND) - {e.key for e in served}
    assert not stale, f"BY_HAND names routes that do not exist: {sorted(stale)}"


def assert_same_404(outside: Response, missing: Response, *, outside_id: str, what: str) -> None:
    assert outside.status_code == missing.status_code == 404, f"{what}: {outside.status_code} {outside.text[:300]}"
    assert outside.headers["content-type"] == missing.headers["content-type"], what
    assert outside.text.replace(outside_id, "<id>") == missing.text.replace(MISSING_ID, "<id>"), what


@pytest.mark.parametrize("kind", [Kind.NODE, Kind.ALERT])
def test_another_tenants_id_is_the_same_404_as_a_missing_one(both: World, kind: Kind) -> None:
    alpha, bravo = both.tenants["alpha"], both.tenants["bravo"]
    name = "node_id" if kind is Kind.NODE else "alert_id"
    theirs = list(bravo.nodes.values() if kind is Kind.NODE else bravo.alerts)
    ours = next(iter(alpha.nodes.values() if kind is Kind.NODE else alpha.alerts))
    tokens = tenant_tokens(alpha) | {"agent": alpha.agent}
    before = bravo_as_seen_by_the_operator(both)
    for endpoint in routes(both, kind):
        compared = 0
        for who, token in tokens.items():
            what = f"{endpoint.key} by alpha's {who} token"
            missing = call(both, endpoint, token, values={name: MISSING_ID})
            if missing.status_code == 403:  # this token lacks the route's scope: nothing to compare
                continue
            compared += 1
            for outside_id in theirs:
                outside = call(both, endpoint, token, values={name: outside_id})
                assert_same_404(outside, missing, outside_id=outside_id, what=what)
            if endpoint.safe:  # the 404 is about the id, not the route: alpha's own id is found
                own = call(both, endpoint, token, values={name: ours})
                assert own.status_code == 200, f"{what} on alpha's own id: {own.status_code} {own.text[:300]}"
        assert compared, f"{endpoint.key}: no tenant token of alpha may call it, so nothing was compared"
    assert bravo_as_seen_by_the_operator(both) == before, "a refused call changed bravo's nodes or alerts"


def bravo_as_seen_by_the_operator(w: World) -> list[Any]:
    bravo = w.tenants["bravo"]
    nodes = [w.harness.get(w.operator, f"/api/v1/nodes/{node_id}").json() for node_id in bravo.nodes.values()]
    return nodes + [w.harness.get(w.operator, f"/api/v1/alerts/{alert_id}").json() for alert_id in bravo.alerts]


def test_reads_show_a_tenant_exactly_what_it_would_see_alone(both: World, alone: World) -> None:
    bravo = both.tenants["bravo"]
    for endpoint in routes(both, Kind.COLLECTION):
        query = COLLECTION_QUERIES.get(endpoint.template, {})
        for who in ("member", "admin"):
            with_bravo = call(both, endpoint, getattr(both.tenants["alpha"], who), values=query)
            without = call(alone, endpoint, getattr(alone.tenants["alpha"], who), values=query)
            what = f"{endpoint.key} by alpha's {who} token"
            assert with_bravo.status_code != 500, f"{what}: {with_bravo.text[:300]}"
            leaked = [name for name in bravo.identifiers() if name in with_bravo.text]
            assert not leaked, f"{what} shows bravo's {leaked}"
            assert with_bravo.status_code == without.status_code, what
            assert both.normalized(with_bravo.text) == alone.normalized(without.text), f"{what} counts bravo's data"


def test_a_node_filter_with_another_tenants_node_finds_what_a_missing_node_finds(both: World) -> None:
    alpha, bravo = both.tenants["alpha"], both.tenants["bravo"]
    filtered = [e for e in routes(both, Kind.COLLECTION) if "node_id" in e.query_params]
    assert filtered, "no read takes a node_id filter: the enumeration lost the predictions and alerts lists"
    for endpoint in filtered:
        missing = call(both, endpoint, alpha.member, values={"node_id": MISSING_ID})
        assert missing.status_code == 200, missing.text
        for node_id in bravo.nodes.values():
            outside = call(both, endpoint, alpha.member, values={"node_id": node_id})
            assert outside.status_code == 200, outside.text
            expected = missing.text.replace(MISSING_ID, "<id>")
            assert outside.text.replace(node_id, "<id>") == expected, f"{endpoint.key} filtered on bravo's node"


def test_cluster_wide_routes_refuse_every_tenant_token(both: World) -> None:
    for endpoint in routes(both, Kind.CLUSTER_WIDE):
        for who, token in tenant_tokens(both.tenants["alpha"]).items():
            response = call(both, endpoint, token, values={})
            assert response.status_code == 403, f"{endpoint.key} by alpha's {who} token: {response.status_code}"


def test_a_tenant_agent_registers_into_its_own_tenant(both: World) -> None:
    alpha, bravo = both.tenants["alpha"], both.tenants["bravo"]
    [endpoint] = routes(both, Kind.OWN_TENANT)
    body = {"hostname": "alpha-gpu-new", "vendor": "nvidia", "gpu_count": 1}
    response = both.harness.client.request(endpoint.method, endpoint.template, json=body, headers=auth(alpha.agent))
    assert response.status_code == 200, response.text
    node_id = response.json()["node_id"]
    try:
        assert both.harness.get(alpha.member, f"/api/v1/nodes/{node_id}").json()["tenant_id"] == alpha.tenant_id
        assert both.harness.get(bravo.member, f"/api/v1/nodes/{node_id}").status_code == 404
        assert both.harness.get(bravo.member, "/api/v1/nodes").json()["total"] == len(bravo.nodes)
    finally:
        assert both.harness.client.delete(f"/api/v1/nodes/{node_id}", headers=auth(alpha.member)).status_code == 204
