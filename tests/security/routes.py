"""What a FastAPI app serves, enumerated from ``app.routes``: every method of every route, with its path filled.

``include_router`` leaves one opaque entry per included router in ``app.routes``; FastAPI's
``iter_route_contexts`` yields the routes behind it with their effective (prefixed) paths. Anything this module
does not know how to probe (a websocket, a host route) fails the enumeration instead of being skipped, and the
result is checked against the app's own OpenAPI document, so that an enumeration that silently lost routes
cannot pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute, iter_route_contexts
from starlette.routing import Mount, Route

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One method of one route."""

    method: str
    template: str
    """The route's path as declared, e.g. ``/api/v1/nodes/{node_id}``."""
    path_format: str
    """The same with bare parameter names, e.g. ``/ui/{path}`` for ``/ui/{path:path}``."""
    path_params: tuple[str, ...]
    query_params: Mapping[str, bool] = field(default_factory=dict)
    """Query parameters (of the route and of its dependencies), name → required."""
    body: Any = None
    """The body model of a FastAPI route that declares one."""

    @property
    def key(self) -> str:
        return f"{self.method} {self.template}"

    @property
    def safe(self) -> bool:
        return self.method in SAFE_METHODS

    def path(self, values: Mapping[str, str]) -> str:
        """The path with every parameter filled from ``values``; a parameter without a value fails loudly."""
        missing = sorted(set(self.path_params) - set(values))
        assert not missing, f"{self.key}: no plausible value for path parameter(s) {missing}; add one to the suite"
        return self.path_format.format(**{name: values[name] for name in self.path_params})


def _query_params(dependant: Any) -> dict[str, bool]:
    found = {param.alias: param.field_info.is_required() for param in dependant.query_params}
    for sub in dependant.dependencies:
        found |= _query_params(sub)
    return found


def endpoints(app: FastAPI) -> list[Endpoint]:
    """Every method of every route ``app`` serves (HEAD included where the route declares it)."""
    found: list[Endpoint] = []
    for context in iter_route_contexts(app.routes):
        route = context.original_route
        assert context.path is not None  # every route the app serves has a path and a path format
        assert context.path_format is not None
        if isinstance(route, APIRoute):
            body = context.body_field.field_info.annotation if context.body_field is not None else None
            for method in sorted(context.methods or ()):
                found.append(
                    Endpoint(
                        method=method,
                        template=context.path,
                        path_format=context.path_format,
                        path_params=tuple(context.param_convertors),
                        query_params=_query_params(context.dependant),
                        body=body,
                    )
                )
        elif isinstance(route, Route):  # a plain starlette route, e.g. FastAPI's own /openapi.json
            for method in sorted(context.methods or ()):
                found.append(
                    Endpoint(
                        method=method,
                        template=context.path,
                        path_format=context.path_format,
                        path_params=tuple(context.param_convertors),
                    )
                )
        elif isinstance(route, Mount):  # static files or a sub-application: probe a file under it
            template = context.path.rstrip("/") + "/{path:path}"
            for method in ("GET", "HEAD"):
                found.append(
                    Endpoint(
                        method=method,
                        template=template,
                        path_format=context.path.rstrip("/") + "/{path}",
                        path_params=("path",),
                    )
                )
        else:
            raise AssertionError(f"the security suite cannot probe {route!r}: teach tests/security/routes.py")
    assert found, "no route enumerated: the enumeration itself is broken"
    _check_against_openapi(app, found)
    return found


def _check_against_openapi(app: FastAPI, found: list[Endpoint]) -> None:
    """Every operation of the app's OpenAPI document is among the enumerated endpoints."""
    keys = {endpoint.key for endpoint in found}
    templates = {endpoint.path_format: endpoint.template for endpoint in found}
    documented = {
        f"{method.upper()} {templates.get(path, path)}"
        for path, operations in app.openapi().get("paths", {}).items()
        for method in operations
    }
    assert documented <= keys, f"routes in the OpenAPI document but not enumerated: {sorted(documented - keys)}"
