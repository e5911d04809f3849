"""HTTP API of one simulated engine: OpenAI-compatible serving, the FT routes and the sim-only routes.

Error mapping, in one place:

- OpenAI routes: malformed input → 400, unknown model → 404, engine not healthy or request aborted → 503,
  all with vLLM's ``{"error": {"message", "type", "code"}}`` body.
- Every route: a body over 1 MiB → 413, JSON nested deeper than 32 levels → 400, in the route's error shape
  (:mod:`heteroflow.core.request_body`), before the route runs.
- FT routes: a body that is not a protocol message → 400 ``{"error": …}``;
  a well-formed command → 202, whether the engine accepts it or rejects it. Upstream forwards the command
  to the engine core in a background task and answers 202 before the engine decides, so the outcome —
  including a rejection (``last_ft_request_id`` + ``ft_error``) — is read from the status route.
- Authentication: the cluster token plays the part of vLLM's ``--api-key``. When one is configured, every
  OpenAI route and both FT routes need ``Authorization: Bearer <token>`` (missing or wrong → 401), checked
  before anything else; ``/health`` and ``/metrics`` stay open, as in vLLM. With no token configured those
  routes are open (vLLM without ``--api-key``; the server binds loopback by default) and the sim-only
  routes (``/sim/…``) answer 403; with one, the sim-only routes need it too, checked before their body.

Profile ``vllm-released`` (``--ft-profile vllm-released``; ``engine-protocol.md``) answers as released vLLM
does instead: FT routes without prefix and open even with a token, an apply body judged in vLLM's order with
its messages and error body, the engine's own uuid in the 202, no ``mask`` or ``ft_state`` in the status;
an in-flight request aborted at a fault ends HTTP 200 with ``finish_reason: "abort"`` and no text, a new
request to a faulted engine hangs until the engine recovers or exits (no 503 anywhere), and ``/health``
answers 503 in the seconds between the engine deciding to exit and the process exiting.

Nothing maps to 500.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.types import ASGIApp, Receive, Scope, Send

from heteroflow.contracts.engine_protocol import (
    SCALE_DOWN,
    ApplyAccepted,
    ApplyRequest,
    EngineProfile,
    ProtocolError,
    apply_path,
    parse_apply_request,
    parse_released_apply,
    status_path,
    wire_entry,
)
from heteroflow.core.openapi import json_request_body
from heteroflow.core.request_body import BodyError, BodyLimit, parse_json
from heteroflow.engine_sim import vocab
from heteroflow.engine_sim.backend import FaultKind
from heteroflow.engine_sim.engine import EngineCore, EngineUnavailableError, RequestAbortedError
from heteroflow.engine_sim.metrics import CONTENT_TYPE, EngineMetrics
from heteroflow.http.gate import challenge_headers
from heteroflow.platform.auth import bearer_matches

SIM_PREFIX = "/sim"
MAX_PROMPT_TOKENS = 2048
"""The worker prefills between two lockstep steps; a longer prompt would stall every peer's collective."""


class _OpenAiError(Exception):
    def __init__(self, status_code: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.kind = kind
        self.message = message


class _SimAuthError(Exception):
    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message


class _TokenGate:
    """ASGI middleware: the cluster token on the OpenAI, FT and sim-only routes, before routing and body parsing
    (a fault injection with a malformed body and no token is a 401, not a 400 that describes the body)."""

    def __init__(self, app: ASGIApp, *, token: str, ft_paths: frozenset[str], ft_guarded: bool = True) -> None:
        self.app = app
        self.token = token
        self.ft_paths = ft_paths
        self.ft_guarded = ft_guarded

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        sim_only = path.startswith(SIM_PREFIX + "/")
        if path in self.ft_paths and not self.ft_guarded:
            pass  # released vLLM guards only /v1, /v2, /inference, /cohere: its FT routes stay open
        elif path in self.ft_paths or sim_only or path.startswith("/v1/"):
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
            if not bearer_matches(headers.get("authorization"), self.token):
                message = "a valid cluster token is required (Authorization: Bearer <token>)"
                body: dict[str, Any] = (
                    {"error": message}
                    if path in self.ft_paths or sim_only
                    else {"error": {"message": message, "type": "AuthenticationError", "param": None, "code": 401}}
                )
                response = JSONResponse(body, status_code=401, headers=challenge_headers(401))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class OpenAiErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class OpenAiErrorOut(BaseModel):
    """vLLM's error answer on the OpenAI routes."""

    error: OpenAiErrorDetail


class PlainErrorOut(BaseModel):
    """The error answer of the FT and sim-only routes."""

    error: str


_ERRORS: dict[int, str] = {
    400: "Malformed input: not the route's body, JSON nested too deeply, or a value out of range.",
    401: "A cluster token is configured and the request does not carry it.",
    403: "Fault injection is disabled: no cluster token is configured.",
    404: "The model is not the one this engine serves.",
    413: "The body is larger than 1 MiB.",
    503: "The engine is not serving (recovering, failed) or the request was aborted: retry elsewhere.",
}


def _errors(model: type[BaseModel], *codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": model, "description": _ERRORS[code]} for code in codes}


_COMPLETION_ANSWERS: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The completion; with stream true, server-sent events ending with data: [DONE].",
        "content": {"application/json": {}, "text/event-stream": {}},
    },
    **_errors(OpenAiErrorOut, 400, 401, 404, 413, 503),
}


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    prompt: str | list[str]
    max_tokens: int = Field(default=16, ge=1)
    stream: bool = False
    temperature: float | None = Field(default=None, ge=0)
    """Accepted and ignored: decoding is always greedy (the outputs must be comparable)."""
    n: int = Field(default=1, ge=1, le=1)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]]


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stream: bool = False
    temperature: float | None = Field(default=None, ge=0)
    n: int = Field(default=1, ge=1, le=1)


class FaultInjection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: FaultKind
    delay_sec: float = Field(default=0.0, ge=0, le=600)
    """Only for ``slow_rebuild``: seconds the next rebuild waits before joining its peers."""


def create_app(
    core: EngineCore,
    *,
    model_name: str,
    ft_path_prefix: str | None = None,
    cluster_token: str | None,
    max_tokens_limit: int,
    profile: EngineProfile = SCALE_DOWN,
) -> FastAPI:
    """``ft_path_prefix`` overrides the profile's route prefix (``None``: the profile's own)."""
    app = FastAPI(
        title="HeteroFlow engine simulator", docs_url=None, redoc_url=None, openapi_url=None, redirect_slashes=False
    )
    prefix = profile.route_prefix if ft_path_prefix is None else ft_path_prefix
    ft_paths = frozenset({status_path(prefix), apply_path(prefix)})
    released = profile.name == "vllm-released"

    def refused_body(path: str, exc: BodyError) -> dict[str, object]:
        if path.startswith("/v1/") and path not in ft_paths:
            return _openai_error_body(exc.status, "BadRequestError", str(exc))
        if path in ft_paths:
            return profile.error_body_for(str(exc), status_code=exc.status)
        return {"error": str(exc)}

    # the token gate is added last, so it runs first: an anonymous body is never read
    app.add_middleware(BodyLimit, render=refused_body)
    if cluster_token:
        app.add_middleware(
            _TokenGate, token=cluster_token, ft_paths=ft_paths, ft_guarded=profile.ft_routes_authenticated
        )
    created = int(time.time())

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        detail = "; ".join(
            f"{'.'.join(str(p) for p in err.get('loc', ()) if p != 'body') or 'body'}: {err.get('msg')}"
            for err in errors[:3]
        )
        if request.url.path.startswith(SIM_PREFIX):
            return JSONResponse({"error": detail}, status_code=400)
        return _openai_error(400, "BadRequestError", detail or "invalid request")

    @app.exception_handler(_OpenAiError)
    async def _openai(_: Request, exc: _OpenAiError) -> JSONResponse:
        return _openai_error(exc.status_code, exc.kind, exc.message)

    @app.exception_handler(_SimAuthError)
    async def _sim_auth(_: Request, exc: _SimAuthError) -> JSONResponse:
        headers = challenge_headers(exc.status_code)
        return JSONResponse({"error": exc.message}, status_code=exc.status_code, headers=headers)

    # -- liveness and models -------------------------------------------------------------------------
    @app.get("/health", response_class=Response)
    async def health() -> Response:
        """Liveness only: 200 while the process serves HTTP, whatever the FT status (released vLLM: 503 once
        the engine core is gone and the API server is about to exit)."""
        if released and profile.dead_health_503 and core.exiting:
            return Response(status_code=503)
        return Response(status_code=200)

    metrics = EngineMetrics(core.status)

    @app.get("/metrics", response_class=Response)
    async def prometheus() -> Response:
        """Unauthenticated, like vLLM's own /metrics."""
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models", responses=_errors(OpenAiErrorOut, 401))
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": model_name,
                    "object": "model",
                    "created": created,
                    "owned_by": "heteroflow",
                    "root": model_name,
                    "max_model_len": MAX_PROMPT_TOKENS + max_tokens_limit,
                }
            ],
        }

    def check_model(requested: str | None) -> None:
        if requested is not None and requested != model_name:
            raise _OpenAiError(404, "NotFoundError", f"The model `{requested}` does not exist.")

    def check_max_tokens(value: int) -> None:
        if value > max_tokens_limit:
            raise _OpenAiError(400, "BadRequestError", f"max_tokens must be ≤ {max_tokens_limit}")

    def check_prompt(tokens: tuple[int, ...]) -> None:
        if not tokens:
            raise _OpenAiError(400, "BadRequestError", "the prompt is empty")
        if len(tokens) > MAX_PROMPT_TOKENS:
            raise _OpenAiError(400, "BadRequestError", f"the prompt is longer than {MAX_PROMPT_TOKENS} tokens")

    # -- completions ---------------------------------------------------------------------------------
    @app.post("/v1/completions", response_model=None, responses=_COMPLETION_ANSWERS)
    async def completions(body: CompletionRequest) -> Response:
        check_model(body.model)
        check_max_tokens(body.max_tokens)
        if isinstance(body.prompt, list):
            if len(body.prompt) != 1:
                raise _OpenAiError(400, "BadRequestError", "exactly one prompt per request is supported")
            prompt = body.prompt[0]
        else:
            prompt = body.prompt
        tokens = vocab.encode(prompt)
        check_prompt(tokens)
        stream = await _start(core, tokens, body.max_tokens, released=released)
        rid = f"cmpl-{uuid.uuid4().hex}"
        if body.stream:
            first = await _first_or_error(stream, released=released)
            return StreamingResponse(
                _completion_chunks(rid, created, model_name, first, stream, released=released),
                media_type="text/event-stream",
            )
        out, finish = await _collect(stream, released=released)
        return JSONResponse(
            {
                "id": rid,
                "object": "text_completion",
                "created": int(time.time()),
                "model": model_name,
                "choices": [{"index": 0, "text": vocab.decode(out), "logprobs": None, "finish_reason": finish}],
                "usage": _usage(len(tokens), len(out)),
            }
        )

    @app.post("/v1/chat/completions", response_model=None, responses=_COMPLETION_ANSWERS)
    async def chat_completions(body: ChatCompletionRequest) -> Response:
        check_model(body.model)
        max_tokens = body.max_completion_tokens or body.max_tokens or 16
        check_max_tokens(max_tokens)
        messages: list[tuple[str, str]] = [(m.role, _text_of(m.content)) for m in body.messages]
        tokens = vocab.encode(vocab.render_chat(messages))
        check_prompt(tokens)
        stream = await _start(core, tokens, max_tokens, released=released)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        if body.stream:
            first = await _first_or_error(stream, released=released)
            return StreamingResponse(
                _chat_chunks(rid, created, model_name, first, stream, released=released), media_type="text/event-stream"
            )
        out, finish = await _collect(stream, released=released)
        return JSONResponse(
            {
                "id": rid,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model_name,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": vocab.decode(out)},
                        "finish_reason": finish,
                    }
                ],
                "usage": _usage(len(tokens), len(out)),
            }
        )

    # -- fault tolerance -----------------------------------------------------------------------------
    @app.get(status_path(prefix), responses=_errors(PlainErrorOut, 401))
    async def ft_status() -> dict[str, Any]:
        answer = core.ft_status()
        return {**answer.wire(), "engines": [wire_entry(e, profile) for e in answer.engines]}

    @app.post(
        apply_path(prefix),
        status_code=202,
        responses={202: {"model": ApplyAccepted}, **_errors(PlainErrorOut, 400, 401, 413)},
        openapi_extra=json_request_body(ApplyRequest),
    )
    async def ft_apply(request: Request) -> JSONResponse:
        raw = await request.body()
        if released:
            return released_apply(request, raw)
        try:
            body = parse_json(raw) if raw else None
        except BodyError as exc:
            return JSONResponse({"error": str(exc)}, status_code=exc.status)
        try:
            command = parse_apply_request(body)
        except ProtocolError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        result = core.apply(command)
        where = status_path(prefix)
        message = (
            f"{command.instruction} accepted; poll {where} for the outcome"
            if result.accepted
            else f"{command.instruction} rejected: {result.message}; see {where}"
        )
        return JSONResponse({"message": message, "request_id": command.request_id}, status_code=202)

    def released_apply(request: Request, raw: bytes) -> JSONResponse:
        """vLLM 0.32/0.33: media type, JSON, then the payload in its order; 202 with the engine's own uuid."""
        media = request.headers.get("content-type", "").lower().split(";", maxsplit=1)[0].strip()
        if media != "application/json":
            return JSONResponse(
                profile.error_body_for(
                    "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed"
                ),
                status_code=400,
            )
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            return JSONResponse(profile.error_body_for("Invalid JSON format"), status_code=400)
        try:
            instruction, params = parse_released_apply(body)
        except ProtocolError as exc:
            return JSONResponse(profile.error_body_for(str(exc)), status_code=400)
        engine_id = str(uuid.uuid4())  # any request_id in the body is ignored
        core.apply(ApplyRequest(instruction=instruction, request_id=engine_id, params=params))
        return JSONResponse({"message": profile.accepted_message, "request_id": engine_id}, status_code=202)

    # -- sim-only, authenticated ---------------------------------------------------------------------
    def require_token(authorization: str | None) -> None:
        if not cluster_token:
            raise _SimAuthError(403, "fault injection is disabled: no cluster token is configured")
        if not bearer_matches(authorization, cluster_token):
            raise _SimAuthError(401, "a valid cluster token is required (Authorization: Bearer <token>)")

    @app.post(f"{SIM_PREFIX}/faults", status_code=202, responses=_errors(PlainErrorOut, 400, 401, 403, 413))
    async def inject(body: FaultInjection, authorization: Annotated[str | None, Header()] = None) -> dict[str, Any]:
        require_token(authorization)
        core.inject(body.kind, delay_sec=body.delay_sec)
        return {"injected": body.kind.value, "dp_rank": core.state.rank}

    @app.get(f"{SIM_PREFIX}/info", responses=_errors(PlainErrorOut, 400, 401, 403))
    async def info(authorization: Annotated[str | None, Header()] = None) -> dict[str, Any]:
        require_token(authorization)
        return core.info()

    return app


def _openai_error_body(status_code: int, kind: str, message: str) -> dict[str, object]:
    return {"error": {"message": message, "type": kind, "param": None, "code": status_code}}


def _openai_error(status_code: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse(_openai_error_body(status_code, kind, message), status_code=status_code)


def _text_of(content: str | list[dict[str, Any]]) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise _OpenAiError(400, "BadRequestError", "only text content parts are supported")
        parts.append(part["text"])
    return "".join(parts)


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


HANG_POLL_SEC = 0.05
"""How often a request held by a faulted released-profile engine looks whether the engine serves again."""


async def _start(
    core: EngineCore, tokens: tuple[int, ...], max_tokens: int, *, released: bool = False
) -> AsyncIterator[int]:
    if released:
        # released vLLM refuses nothing: a new request to a faulted engine waits until it serves again or exits
        while not core.state.serving:  # noqa: ASYNC110 - serving changes in many transitions; a poll is plainer
            await asyncio.sleep(HANG_POLL_SEC)
    if not core.state.serving:
        raise _OpenAiError(503, "ServiceUnavailableError", f"engine is {core.state.health}; retry elsewhere")
    return core.generate(prompt_tokens=tokens, max_tokens=max_tokens)


async def _first_or_error(stream: AsyncIterator[int], *, released: bool = False) -> int | None:
    """The first token, so that a stream that cannot start answers 503 instead of a broken stream
    (released vLLM: ``None``, a stream that ends at once with ``finish_reason: "abort"``)."""
    try:
        return await anext(stream)
    except StopAsyncIteration:
        return None
    except (EngineUnavailableError, RequestAbortedError) as exc:
        if released:
            return None
        raise _OpenAiError(503, "ServiceUnavailableError", str(exc)) from exc


async def _collect(stream: AsyncIterator[int], *, released: bool = False) -> tuple[list[int], str]:
    """The tokens and the finish reason; an abort is a 503, or (released vLLM) 200 ``abort`` with no text."""
    out: list[int] = []
    try:
        async for token in stream:
            out.append(token)
    except (EngineUnavailableError, RequestAbortedError) as exc:
        if released:
            return [], "abort"
        raise _OpenAiError(503, "ServiceUnavailableError", f"request aborted: {exc}") from exc
    return out, "length"


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"


ABORTED = object()
"""Marks a stream that a released-profile engine aborted: it ends with ``finish_reason: "abort"``."""


async def _tokens_then_error(
    first: int | None, stream: AsyncIterator[int], *, released: bool
) -> AsyncIterator[int | str | object]:
    if first is None:
        yield ABORTED
        return
    yield first
    try:
        async for token in stream:
            yield token
    except (EngineUnavailableError, RequestAbortedError) as exc:
        yield ABORTED if released else f"request aborted: {exc}"


def _error_event(message: str) -> str:
    return _sse({"error": {"message": message, "type": "ServiceUnavailableError", "param": None, "code": 503}})


async def _completion_chunks(
    rid: str, created: int, model: str, first: int | None, stream: AsyncIterator[int], *, released: bool = False
) -> AsyncIterator[str]:
    def chunk(text: str, finish: str | None) -> str:
        return _sse(
            {
                "id": rid,
                "object": "text_completion",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
            }
        )

    async for item in _tokens_then_error(first, stream, released=released):
        if item is ABORTED:
            yield chunk("", "abort")
            yield "data: [DONE]\n\n"
            return
        if isinstance(item, str):
            yield _error_event(item)  # the stream ends without [DONE]: the client sees a failed request
            return
        assert isinstance(item, int)
        yield chunk(vocab.decode([item]), None)
    yield chunk("", "length")
    yield "data: [DONE]\n\n"


async def _chat_chunks(
    rid: str, created: int, model: str, first: int | None, stream: AsyncIterator[int], *, released: bool = False
) -> AsyncIterator[str]:
    def chunk(delta: dict[str, str], finish: str | None) -> str:
        return _sse(
            {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
        )

    yield chunk({"role": "assistant", "content": ""}, None)
    async for item in _tokens_then_error(first, stream, released=released):
        if item is ABORTED:
            yield chunk({}, "abort")
            yield "data: [DONE]\n\n"
            return
        if isinstance(item, str):
            yield _error_event(item)
            return
        assert isinstance(item, int)
        yield chunk({"content": vocab.decode([item])}, None)
    yield chunk({}, "length")
    yield "data: [DONE]\n\n"
