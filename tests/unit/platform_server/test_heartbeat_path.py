"""Which requests are heartbeats (``platform_server/auth.heartbeat_node_id``): the answer each middleware layer
asks for is kept in the request's scope, and a scope whose method or path changed is judged again."""

from __future__ import annotations

from typing import Any

import pytest

from heteroflow.platform_server.auth import heartbeat_node_id


@pytest.mark.parametrize(
    ("method", "path", "expected"),
    [
        ("POST", "/api/v1/nodes/n-1/heartbeat", "n-1"),
        ("GET", "/api/v1/nodes/n-1/heartbeat", None),
        ("POST", "/api/v1/nodes//heartbeat", None),
        ("POST", "/api/v1/nodes/a/b/heartbeat", None),
        ("POST", "/api/v1/nodes/register", None),
        ("POST", "/api/v1/nodes/n-1/heartbeat/", None),
    ],
)
def test_a_heartbeat_is_a_post_to_one_nodes_heartbeat_path(method: str, path: str, expected: str | None) -> None:
    scope: dict[str, Any] = {"type": "http", "method": method, "path": path}
    assert heartbeat_node_id(scope) == expected
    assert heartbeat_node_id(scope) == expected  # asked again: the kept answer


def test_a_scope_whose_path_or_method_changed_is_judged_again() -> None:
    scope: dict[str, Any] = {"type": "http", "method": "POST", "path": "/api/v1/nodes/n-1/heartbeat"}
    assert heartbeat_node_id(scope) == "n-1"
    scope["path"] = "/api/v1/nodes/n-2/heartbeat"
    assert heartbeat_node_id(scope) == "n-2"
    scope["method"] = "PUT"
    assert heartbeat_node_id(scope) is None
