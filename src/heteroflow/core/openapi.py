"""OpenAPI fragments for routes that read their own JSON body. Purely computational.

A route that parses its body itself (to answer a malformed one with its own 400 rather than a framework's 422)
declares no body parameter, so its schema would show no body at all. :func:`json_request_body` puts the wire
model's schema back, for ``openapi_extra``; the model's nested definitions are inlined, because a ``$ref`` into
the model's own ``$defs`` would not resolve inside the larger OpenAPI document.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from pydantic import BaseModel

_DEFS_PREFIX = "#/$defs/"


def json_request_body(model: type[BaseModel], *, required: bool = True) -> dict[str, Any]:
    """``openapi_extra`` declaring an ``application/json`` body of ``model`` (validation mode).

    A fresh copy each call (FastAPI merges it into the operation it builds); the schema itself is computed once
    per model, since every app built (one per controller start) asks for the same few."""
    return {
        "requestBody": {
            "required": required,
            "content": {"application/json": {"schema": copy.deepcopy(_inlined_schema(model))}},
        }
    }


@functools.cache
def _inlined_schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema(mode="validation")
    definitions: dict[str, Any] = schema.pop("$defs", {})
    inlined: dict[str, Any] = _inline(schema, definitions, seen=())
    return inlined


def _inline(node: Any, definitions: dict[str, Any], *, seen: tuple[str, ...]) -> Any:
    if isinstance(node, list):
        return [_inline(item, definitions, seen=seen) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith(_DEFS_PREFIX):
        name = ref.removeprefix(_DEFS_PREFIX)
        if name in seen:
            raise ValueError(f"{name} refers to itself; a recursive model cannot be inlined")
        siblings = {key: value for key, value in node.items() if key != "$ref"}
        return _inline({**definitions[name], **siblings}, definitions, seen=(*seen, name))
    return {key: _inline(value, definitions, seen=seen) for key, value in node.items()}
