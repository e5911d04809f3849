"""The OpenAPI request-body fragment of routes that parse their own JSON body."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel, Field

from heteroflow.core.openapi import json_request_body


class Device(BaseModel):
    device_id: str = Field(min_length=1)


class Endpoint(BaseModel):
    id: int = Field(ge=0)
    devices: list[Device] = []
    main: Device | None = None


class Registration(BaseModel):
    pod_id: str
    endpoints: list[Endpoint]


class Tree(BaseModel):
    children: list[Tree] = []


def test_nested_models_are_inlined_so_that_no_reference_dangles() -> None:
    extra = json_request_body(Registration)
    body = extra["requestBody"]
    assert body["required"] is True
    schema = body["content"]["application/json"]["schema"]
    text = json.dumps(schema)
    assert "$ref" not in text
    assert "$defs" not in text
    endpoint = schema["properties"]["endpoints"]["items"]
    assert endpoint["properties"]["id"]["minimum"] == 0
    assert endpoint["properties"]["devices"]["items"]["properties"]["device_id"]["minLength"] == 1
    assert schema["required"] == ["pod_id", "endpoints"]


def test_an_optional_body_is_declared_not_required() -> None:
    assert json_request_body(Device, required=False)["requestBody"]["required"] is False


def test_a_recursive_model_cannot_be_inlined() -> None:
    with pytest.raises(ValueError, match="refers to itself"):
        json_request_body(Tree)
