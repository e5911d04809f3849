"""Validation of an OpenAI request body before it is routed. Purely computational.

The Coordinator reads only ``model`` (to route) and ``stream`` (to relay or buffer); everything else is the
engine's business and the body is forwarded byte for byte. What is checked here is what could hurt the
Coordinator itself or make routing impossible: size, encoding, nesting depth, shape. Each failure is a 4xx
with a sentence, never a 500.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from heteroflow.core.request_body import exceeds_depth
from heteroflow.core.request_body import nesting_depth as nesting_depth  # re-exported for the tests
from heteroflow.serving.coordinator.errors import BadRequestError, BodyTooLargeError

MAX_JSON_DEPTH = 64
"""Deepest nesting accepted. Real OpenAI bodies nest a handful of levels; deeper ones only serve to make
parsers (ours, the engine's) recurse, so they are refused here rather than forwarded."""


@dataclass(frozen=True, slots=True)
class InferenceRequest:
    """A validated body: the routing facts and the bytes to forward unchanged."""

    model: str
    stream: bool
    raw: bytes


def check_size(length: int, *, max_bytes: int) -> None:
    if length > max_bytes:
        raise BodyTooLargeError(f"the request body is larger than {max_bytes} bytes")


def parse_inference_body(raw: bytes, *, max_bytes: int) -> InferenceRequest:
    """The routing facts of an OpenAI completions or chat body; raises a 4xx :class:`CoordinatorError`."""
    check_size(len(raw), max_bytes=max_bytes)
    if not raw.strip():
        raise BadRequestError("the request body is empty; a JSON object with a 'model' is required")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequestError("the request body is not UTF-8 encoded JSON") from exc
    # the depth on the bytes, before parsing (a C-speed scan: never a Python walk of a parsed megabyte); the
    # app's BodyLimit has refused a deeper body already, this keeps the function safe on its own
    if exceeds_depth(raw, max_depth=MAX_JSON_DEPTH):
        raise BadRequestError(f"the request body is nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        body = json.loads(text)
    except RecursionError as exc:
        raise BadRequestError(f"the request body is nested deeper than {MAX_JSON_DEPTH} levels") from exc
    except ValueError as exc:
        raise BadRequestError(f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequestError("the request body must be a JSON object")
    model = body.get("model")
    if model is None:
        raise BadRequestError("'model' is required: the Coordinator routes by it")
    if not isinstance(model, str) or not model.strip():
        raise BadRequestError("'model' must be a non-empty string")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise BadRequestError("'stream' must be a boolean")
    return InferenceRequest(model=model, stream=stream, raw=raw)
