"""HTTP calls to a running local cluster, by what they are for (the CLI, the live view and tests use them).

Every call carries the credential of where it goes (:class:`ClusterAuth`): the admin token to the platform
server, the API key to the Coordinator's OpenAI routes, the cluster token to every internal route
(``docs/local-cluster.md``, tokens). Transport failures are translated into :class:`ClusterUnreachableError`
here, so callers handle one error type.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import httpx

from heteroflow.contracts.serving import (
    COORDINATOR_INSTANCES_PATH,
    NM_STATUS_PATH,
    REPORT_HARDWARE_FAULT_PATH,
)
from heteroflow.http.tls import client_tls
from heteroflow.local.state import ClusterState

CONTROLLER_STATUS_PATH = "/controller/fault_tolerance/status"
CONTROLLER_ROUNDS_PATH = "/controller/fault_tolerance/rounds"


class ClusterUnreachableError(Exception):
    """A component of the cluster did not answer, or answered with an error status."""


class ClusterAuth(httpx.Auth):
    """The bearer credential of a request by its destination: three secrets, none of which opens the others'
    doors (an older state file has no cluster token or API key: the admin token was both then)."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state

    def token_for(self, url: str) -> str:
        state = self.state
        if url.startswith(state.server_url.rstrip("/") + "/"):
            return state.admin_token
        if url.startswith(state.coordinator_url.rstrip("/") + "/v1/"):
            return state.api_key or state.admin_token
        return state.cluster_token or state.admin_token

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        if "authorization" not in request.headers:  # a caller's own credential wins
            request.headers["Authorization"] = f"Bearer {self.token_for(str(request.url))}"
        yield request


class ClusterClient:
    def __init__(self, state: ClusterState, *, timeout_sec: float = 5.0) -> None:
        self.state = state
        self._http = httpx.Client(
            auth=ClusterAuth(state), timeout=timeout_sec, trust_env=False, verify=client_tls(trust_env=False)
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ClusterClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _call(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, url, **kwargs)
        except httpx.HTTPError as exc:
            raise ClusterUnreachableError(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 400:
            raise ClusterUnreachableError(f"{method} {url}: HTTP {response.status_code}: {response.text[:300]}")
        return response

    def _json(self, method: str, url: str, **kwargs: Any) -> Any:
        return self._call(method, url, **kwargs).json()

    # -- controller ---------------------------------------------------------------------------------------
    def controller_status(self) -> list[dict[str, Any]]:
        """``GET /controller/fault_tolerance/status``: one runtime per instance."""
        found: list[dict[str, Any]] = self._json("GET", self.state.controller_url + CONTROLLER_STATUS_PATH)
        return found

    def instance_status(self, instance_id: str) -> dict[str, Any] | None:
        for entry in self.controller_status():
            if entry.get("instance_id") == instance_id:
                return entry
        return None

    def rounds(self, instance_id: str) -> list[dict[str, Any]]:
        """Summaries of the instance's rounds in the controller's memory, oldest first."""
        found: list[dict[str, Any]] = self._json(
            "GET", self.state.controller_url + CONTROLLER_ROUNDS_PATH, params={"instance_id": instance_id}
        )
        return found

    def round(self, request_id: str) -> dict[str, Any]:
        """One round's evidence timeline."""
        found: dict[str, Any] = self._json("GET", f"{self.state.controller_url}{CONTROLLER_ROUNDS_PATH}/{request_id}")
        return found

    def restore(self, instance_id: str) -> dict[str, Any]:
        """``POST /controller/fault_tolerance/instances/{id}/restore``: a scaled-down instance back to its
        configured size; ``{"request_id", "instance_id"}`` (a refusal raises, its reason in the message)."""
        found: dict[str, Any] = self._json(
            "POST", f"{self.state.controller_url}/controller/fault_tolerance/instances/{instance_id}/restore"
        )
        return found

    def report_hardware_fault(self, body: dict[str, Any]) -> dict[str, Any]:
        found: dict[str, Any] = self._json("POST", self.state.controller_url + REPORT_HARDWARE_FAULT_PATH, json=body)
        return found

    # -- platform -----------------------------------------------------------------------------------------
    def platform_nodes(self) -> list[dict[str, Any]]:
        """Every node the platform knows (``GET /api/v1/nodes``, paged through)."""
        found: list[dict[str, Any]] = []
        while True:
            page = self._json(
                "GET", self.state.server_url + "/api/v1/nodes", params={"limit": 1000, "offset": len(found)}
            )
            found.extend(page.get("items", []))
            if not page.get("items") or len(found) >= int(page.get("total", 0)):
                return found

    def agent_heartbeat(self, node_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /api/v1/nodes/{node_id}/heartbeat`` as an operator: the admin token may speak for any node,
        while an agent token needs the node's own credential, which stays with the node's simulated agent."""
        found: dict[str, Any] = self._json(
            "POST", f"{self.state.server_url}/api/v1/nodes/{node_id}/heartbeat", json=body
        )
        return found

    # -- coordinator --------------------------------------------------------------------------------------
    def published(self, instance_id: str) -> list[int] | None:
        """Endpoint ids the Coordinator publishes for the instance (``None``: it knows no such instance)."""
        answer = self._json("GET", self.state.coordinator_url + COORDINATOR_INSTANCES_PATH)
        for view in answer.get("instances", []):
            if view.get("instance_id") == instance_id:
                return sorted(int(e["id"]) for e in view.get("endpoints", []))
        return None

    def completion(self, prompt: str, *, max_tokens: int = 8, model: str | None = None) -> str:
        """One completion through the Coordinator (the admin token is a valid API key there)."""
        model = model or self.state.instances[0].model
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens}
        answer = self._json("POST", self.state.coordinator_url + "/v1/completions", json=body)
        return str(answer["choices"][0]["text"])

    # -- NodeManagers and engines -------------------------------------------------------------------------
    def node_manager_status(self, node_manager_url: str) -> dict[str, Any]:
        found: dict[str, Any] = self._json("GET", node_manager_url + NM_STATUS_PATH)
        return found

    def engine_info(self, engine_url: str) -> dict[str, Any]:
        """The simulator's ``GET /sim/info`` (pids, members, master) of one rank."""
        found: dict[str, Any] = self._json("GET", engine_url + "/sim/info")
        return found

    def inject(self, engine_url: str, kind: str) -> dict[str, Any]:
        """The simulator's ``POST /sim/faults``."""
        found: dict[str, Any] = self._json("POST", engine_url + "/sim/faults", json={"kind": kind})
        return found
