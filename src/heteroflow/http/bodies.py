"""A route's JSON body read into its pydantic model, after the limits of :mod:`heteroflow.core.request_body`.

The size, read time and nesting limits have one implementation (:class:`~heteroflow.core.request_body.BodyLimit`
and :func:`~heteroflow.core.request_body.parse_json`); this module only turns the checked bytes into a model and
every way that can fail into one :class:`BadBodyError` whose message names the first wrong field.
"""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from heteroflow.core.request_body import MAX_BODY_BYTES, MAX_JSON_DEPTH, BodyError, parse_json

_M = TypeVar("_M", bound=BaseModel)


class BadBodyError(Exception):
    """The body is not the route's model: not an object, or a field is wrong (the service answers 400)."""


async def read_model(
    request: Request,
    model: type[_M],
    *,
    empty_ok: bool = False,
    body_errors_as_bad_body: bool = False,
    max_bytes: int = MAX_BODY_BYTES,
    max_depth: int = MAX_JSON_DEPTH,
) -> _M:
    """The request's body as ``model``.

    ``empty_ok``: an empty body is the model's defaults. A :class:`~heteroflow.core.request_body.BodyError`
    (too large, too deep, not JSON) propagates with its own status, unless ``body_errors_as_bad_body``, which
    turns it into a :class:`BadBodyError` (a service whose every body refusal is a 400).
    """
    raw_bytes = await request.body()
    raw: object = {}
    if not (empty_ok and not raw_bytes.strip()):
        try:
            raw = parse_json(raw_bytes, max_bytes=max_bytes, max_depth=max_depth)
        except BodyError as exc:
            if not body_errors_as_bad_body:
                raise
            raise BadBodyError(str(exc).replace("the request body", "the body")) from exc
    if not isinstance(raw, dict):
        raise BadBodyError("the body must be a JSON object")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(part) for part in err["loc"]) or "body"
        raise BadBodyError(f"{where}: {err['msg']}") from exc
