"""Every route of every service refuses a caller without the right credential (``health.md`` H-80;
``serving-ft.md``: internal routes need the cluster token).

Routes are enumerated from each app, never listed here: a route added tomorrow is probed tomorrow, and it fails
these tests unless it authenticates or is put on :data:`OPEN_ROUTES` with the reason it may be open.
"""

from __future__ import annotations

from typing import Any

import pytest
from httpx2 import Response

from heteroflow.platform.auth import Scope
from tests.security.routes import Endpoint, endpoints
from tests.security.services import API_KEY, CLUSTER_TOKEN, PATH_VALUES, WRONG_TOKEN, Service, auth

OPEN_ROUTES: dict[tuple[str, str], str] = {
    # Probes: kubelet and load balancers call them without a token; they answer from the process alone.
    ("platform", "GET /health"): "liveness probe; answers from the event loop, never the database, no data",
    ("controller", "GET /health"): "liveness probe, no data",
    ("controller", "GET /ready"): "readiness probe: whether this controller acts (active/standby), no fleet data",
    ("node_manager", "GET /health"): "liveness probe, no data",
    ("coordinator", "GET /health"): "liveness probe, no data",
    ("engine_sim", "GET /health"): "liveness probe, as vLLM's",
    # The web pages: a static shell that must load before the user signs in. It carries no data; every data
    # call of the page is made by the browser with the token the user enters.
    ("platform", "GET /"): "redirect to the GPU-health page of the web shell",
    ("platform", "GET /nodes/gpu-health"): "web page shell (static HTML)",
    ("platform", "GET /nodes"): "web page shell (static HTML)",
    ("platform", "GET /alerts"): "web page shell (static HTML)",
    ("platform", "GET /serving"): "web page shell (static HTML)",
    ("platform", "GET /ui/{path:path}"): "the shell's static assets: .js, .css and .svg files under web/ui only",
    # The simulator plays vLLM, whose /metrics stays open even with --api-key. The real engine behind a
    # NodeManager serves it the same way, and the simulator must not differ from the engine it stands for.
    ("engine_sim", "GET /metrics"): "vLLM's /metrics is open; the simulator mirrors the real engine",
}
"""The only routes that answer without a credential. OpenAPI is not here: every service either does not serve
it or serves it behind its token."""

ANY_VALID_TOKEN: dict[str, str] = {
    "GET /healthz": "says only 'ok': the check that a token is valid",
    "GET /api/v1/auth/whoami": "describes the caller's own token (the Coordinator verifies API keys with it)",
    "GET /openapi.json": "the API description, which docs/api.md publishes anyway",
    "POST /api/v1/auth/session": "signs a browser in with exactly the token's scopes and tenant, nothing more",
    "GET /api/v1/auth/session": "describes the caller's own browser session (404 to a bearer token: it has none)",
    "DELETE /api/v1/auth/session": "ends the caller's own browser session (sign-out)",
}
"""Platform routes that any valid token may call, whatever its scopes."""


def send(service: Service, endpoint: Endpoint, *, headers: dict[str, str] | None = None, **params: str) -> Response:
    # a body-carrying method gets a JSON body that is no route's model: parsed, then refused, never acted on
    body: dict[str, Any] = {"json": []} if endpoint.method in ("POST", "PUT", "PATCH") else {}
    return service.client.request(
        endpoint.method, endpoint.path(PATH_VALUES), headers=headers or {}, params=params or None, **body
    )


def reached(response: Response) -> bool:
    """The route itself answered: neither a credential refusal nor the router's own 404/405."""
    if response.status_code in (401, 403, 405):
        return False
    return not (response.status_code == 404 and response.content and response.json() == {"detail": "Not Found"})


def required_credential(service: Service, endpoint: Endpoint) -> str:
    """The credential a non-open route of a serving service takes: the OpenAI routes of the Coordinator take an
    API key, every other internal route the cluster token."""
    if service.name == "coordinator" and endpoint.template.startswith("/v1/"):
        return "api_key"
    return "cluster"


def guarded(service: Service) -> list[Endpoint]:
    return [e for e in endpoints(service.app) if (service.name, e.key) not in OPEN_ROUTES]


def assert_refused(response: Response, what: str) -> None:
    assert response.status_code == 401, f"{what}: {response.status_code} {response.text[:300]}"
    assert response.headers.get("www-authenticate") == "Bearer", what


def test_the_allow_list_names_routes_that_exist_and_are_open(service: Service) -> None:
    served = {e.key: e for e in endpoints(service.app)}
    listed = [key for name, key in OPEN_ROUTES if name == service.name]
    assert set(listed) <= set(served), f"stale OPEN_ROUTES entries: {sorted(set(listed) - set(served))}"
    for key in listed:
        response = send(service, served[key])
        assert response.status_code < 400, f"{service.name} {key} is listed as open but answers {response.status_code}"


def test_every_guarded_route_refuses_a_missing_malformed_or_unknown_token(service: Service) -> None:
    right = next(iter(service.tokens.values()))
    attempts = {
        "no Authorization header": {},
        "an empty Authorization header": {"Authorization": ""},
        "Bearer without a token": {"Authorization": "Bearer"},
        "an unknown bearer token": auth(WRONG_TOKEN),
        "a valid token under the Basic scheme": {"Authorization": f"Basic {right}"},
    }
    routes = guarded(service)
    assert routes, f"{service.name}: nothing but open routes enumerated"
    for endpoint in routes:
        for what, headers in attempts.items():
            assert_refused(send(service, endpoint, headers=headers), f"{service.name} {endpoint.key} with {what}")
        # a token in the query string is never accepted (URLs end up in proxy and access logs)
        for token in service.tokens.values():
            response = send(service, endpoint, access_token=token, token=token)
            assert_refused(response, f"{service.name} {endpoint.key} with the token in the query string")


def platform_session(platform: Service) -> dict[str, str]:
    """The headers of a write made with a live browser session of the platform's admin token (cookie, CSRF
    token, the platform's Origin), checked to work on the platform itself."""
    signed_in = platform.client.post("/api/v1/auth/session", headers=auth(platform.tokens["admin"]))
    assert signed_in.status_code == 201, signed_in.text
    platform.client.cookies.clear()
    cookie = signed_in.headers["set-cookie"].split(";", 1)[0]
    origin = str(platform.client.base_url).rstrip("/")
    headers = {"Cookie": cookie, "Origin": origin, "X-CSRF-Token": signed_in.json()["csrf_token"]}
    assert platform.client.get("/api/v1/server/status", headers=headers).status_code == 200
    return headers


@pytest.mark.parametrize("name", ["controller", "node_manager", "coordinator", "engine_sim"])
def test_internal_routes_take_their_own_credential_and_nothing_else(
    name: str, platform: Service, request: pytest.FixtureRequest
) -> None:
    service: Service = request.getfixturevalue(name)
    credentials = {
        "the platform's admin token": platform.tokens["admin"],
        "the cluster token": CLUSTER_TOKEN,
        "a Coordinator API key": API_KEY,
    }
    session = platform_session(platform)
    for endpoint in guarded(service):
        own = service.tokens[required_credential(service, endpoint)]
        for what, token in credentials.items():
            if token != own:
                assert_refused(send(service, endpoint, headers=auth(token)), f"{name} {endpoint.key} with {what}")
        what = "the platform admin's browser session"
        assert_refused(send(service, endpoint, headers=session), f"{name} {endpoint.key} with {what}")
        response = send(service, endpoint, headers=auth(own))
        assert reached(response), f"{name} {endpoint.key} refuses its own credential: {response.status_code}"
        assert response.status_code != 500, f"{name} {endpoint.key}: {response.text[:300]}"


def test_the_platform_refuses_the_cluster_token_and_api_keys(platform: Service) -> None:
    for endpoint in guarded(platform):
        for what, token in (("the cluster token", CLUSTER_TOKEN), ("a Coordinator API key", API_KEY)):
            assert_refused(send(platform, endpoint, headers=auth(token)), f"platform {endpoint.key} with {what}")


BODILESS_POSTS = frozenset({"POST /controller/fault_tolerance/instances/{instance_id}/restore"})
"""Internal POST routes that read no body (the restore is named by its path): nothing to judge."""


def test_a_body_that_is_not_json_is_refused_as_unauthenticated_before_it_is_judged(service: Service) -> None:
    admin = service.tokens.get("admin")
    for endpoint in guarded(service):
        if endpoint.method not in ("POST", "PUT", "PATCH") or (service.name == "platform" and endpoint.body is None):
            continue  # a platform route without a body model (a release) has no body to judge
        if endpoint.key in BODILESS_POSTS:
            continue
        own = admin or service.tokens[required_credential(service, endpoint)]
        # a heartbeat for a node that does not exist is refused on its head, before its body is judged
        judged = (400, 422, 404) if endpoint.key.endswith("/heartbeat") and service.name == "platform" else (400, 422)
        for token, refused in ((None, True), (WRONG_TOKEN, True), (own, False)):
            response = service.client.request(
                endpoint.method,
                endpoint.path(PATH_VALUES),
                content=b'{"not json',
                headers={"Content-Type": "application/json", **(auth(token) if token else {})},
            )
            what = f"{service.name} {endpoint.key} with a body that is not JSON and {token or 'no token'}"
            if refused:
                assert_refused(response, what)
            else:  # the holder of the right token is told what is wrong with the body
                assert response.status_code in judged, f"{what}: {response.status_code} {response.text[:300]}"


def test_every_platform_route_demands_one_scope_and_answers_403_to_the_others(platform: Service) -> None:
    """Admin passes everywhere; each other route passes exactly one scope (a write route never a read scope)
    and answers 403 to the rest, whatever the route does after that (404 for a missing id is a pass)."""
    scopes = [scope.value for scope in Scope]
    for endpoint in guarded(platform):
        outcome = {scope: send(platform, endpoint, headers=auth(platform.tokens[scope])) for scope in scopes}
        for scope, response in outcome.items():
            assert response.status_code != 500, f"{endpoint.key} with {scope}: {response.text[:300]}"
            assert response.status_code != 401, f"{endpoint.key} refuses a valid {scope} token as unknown"
        passed = {scope for scope, response in outcome.items() if reached(response)}
        refused = {scope for scope, response in outcome.items() if response.status_code == 403}
        codes = {scope: response.status_code for scope, response in outcome.items()}
        assert passed | refused == set(scopes), f"{endpoint.key}: {codes}"
        assert Scope.ADMIN.value in passed, f"{endpoint.key} refuses an admin token"
        others = passed - {Scope.ADMIN.value}
        if endpoint.key in ANY_VALID_TOKEN:
            assert others == set(scopes) - {Scope.ADMIN.value}, f"{endpoint.key} is listed as open to any token"
            continue
        assert len(others) <= 1, f"{endpoint.key} passes several scopes: {sorted(others)}"
        if not endpoint.safe:
            assert not any(scope.endswith(":read") for scope in others), f"{endpoint.key} writes with {others}"


def test_a_tenant_token_opens_no_more_than_its_scopes_and_is_refused_with_403(platform: Service) -> None:
    """A tenant's token passes where the same scope without a tenant passes, or gets 403 where the route's data
    covers every tenant; it never passes where its scopes do not, and is never taken for an unknown token. What
    the routes it passes show is the tenant isolation tests' business."""
    for endpoint in guarded(platform):
        for scope in Scope:
            cluster_wide = send(platform, endpoint, headers=auth(platform.tokens[scope.value]))
            tenant = send(platform, endpoint, headers=auth(platform.tokens[f"tenant:{scope.value}"]))
            what = f"{endpoint.key} with a tenant's {scope.value} token"
            assert tenant.status_code != 500, f"{what}: {tenant.text[:300]}"
            if reached(tenant):
                assert reached(cluster_wide), f"{what} passes where the scope without a tenant does not"
            else:
                assert tenant.status_code == 403, f"{what}: {tenant.status_code} {tenant.text[:300]}"
