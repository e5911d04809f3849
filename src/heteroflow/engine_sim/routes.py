"""The simulated engine's routers (assembled in :mod:`.assembly`).

- :func:`operations_router` — ``GET /health`` (liveness) and ``GET /metrics``, open as in vLLM.
- :func:`openai_router` — ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions``.
- :func:`ft_router` — the FT status and apply routes of the engine protocol profile.
- :func:`elastic_ep_router` — vLLM 0.34's elastic EP routes, with ``--enable-elastic-ep``.
- :func:`sim_router` — the sim-only routes (``/sim/faults``, ``/sim/info``), which need the cluster token.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from heteroflow.contracts.engine_protocol import (
    IS_SCALING_ELASTIC_EP_PATH,
    SCALE_ELASTIC_EP_PATH,
    ApplyAccepted,
    ApplyRequest,
    EngineProfile,
    ProtocolError,
    apply_path,
    elastic_ep_drain_timeout_text,
    parse_apply_request,
    parse_released_apply,
    parse_scale_elastic_ep,
    parse_v034_apply,
    status_path,
    wire_entry,
)
from heteroflow.core.openapi import json_request_body
from heteroflow.core.request_body import BodyError, parse_json
from heteroflow.engine_sim import vocab
from heteroflow.engine_sim.backend import FaultKind
from heteroflow.engine_sim.completions import (
    MAX_PROMPT_TOKENS,
    OpenAiError,
    chat_chunks,
    collect,
    completion_chunks,
    first_or_error,
    start,
    text_of,
    usage,
)
from heteroflow.engine_sim.elastic import ElasticEpRefusal
from heteroflow.engine_sim.engine import ElasticEpFailedError, EngineCore
from heteroflow.engine_sim.metrics import CONTENT_TYPE, EngineMetrics
from heteroflow.http.gate import TokenGate

SIM_PREFIX = "/sim"
FAULT_INJECTION_DISABLED = "fault injection is disabled: no cluster token is configured"


class SimAuthError(Exception):
    """A sim-only route refused: 403 with no cluster token configured, 401 without the token."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message


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
    408: "The resize timed out (elastic EP; vLLM's text names the drain timeout whatever timed out).",
    500: 'The resize failed (elastic EP): "Scale failed"; the reason is in /is_scaling_elastic_ep.',
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


def operations_router(core: EngineCore, *, profile: EngineProfile) -> APIRouter:
    """Liveness and metrics, open without a token as in vLLM.

    ``/health`` is the engine's own, not :func:`heteroflow.http.probes.probes_router`'s: an empty body, as
    vLLM answers, and (released vLLM) 503 once the engine core is gone and the API server is about to exit.
    """
    router = APIRouter()

    @router.get("/health", response_class=Response)
    async def health() -> Response:
        """Liveness only: 200 while the process serves HTTP, whatever the FT status (vLLM 0.32: 503 once the
        engine core is gone and the API server is about to exit; vLLM 0.34: 503 while the engine is dead)."""
        if profile.dead_health_503 and core.exiting:
            return Response(status_code=503)
        if profile.dead_health_only_503 and core.state.health == "dead":
            return Response(status_code=503)
        return Response(status_code=200)

    metrics = EngineMetrics(core.status)

    @router.get("/metrics", response_class=Response)
    async def prometheus() -> Response:
        """Unauthenticated, like vLLM's own /metrics."""
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    return router


def openai_router(core: EngineCore, *, model_name: str, max_tokens_limit: int, profile: EngineProfile) -> APIRouter:
    """The models list and the two completion routes, as vLLM answers them."""
    router = APIRouter()
    released = profile.aborted_requests == "200-abort"
    hang = profile.faulted_new_requests == "hang"
    faulted_text = profile.faulted_text
    created = int(time.time())

    @router.get("/v1/models", responses=_errors(OpenAiErrorOut, 401))
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
            raise OpenAiError(404, "NotFoundError", f"The model `{requested}` does not exist.")

    def check_max_tokens(value: int) -> None:
        if value > max_tokens_limit:
            raise OpenAiError(400, "BadRequestError", f"max_tokens must be ≤ {max_tokens_limit}")

    def check_prompt(tokens: tuple[int, ...]) -> None:
        if not tokens:
            raise OpenAiError(400, "BadRequestError", "the prompt is empty")
        if len(tokens) > MAX_PROMPT_TOKENS:
            raise OpenAiError(400, "BadRequestError", f"the prompt is longer than {MAX_PROMPT_TOKENS} tokens")

    @router.post("/v1/completions", response_model=None, responses=_COMPLETION_ANSWERS)
    async def completions(body: CompletionRequest) -> Response:
        check_model(body.model)
        check_max_tokens(body.max_tokens)
        if isinstance(body.prompt, list):
            if len(body.prompt) != 1:
                raise OpenAiError(400, "BadRequestError", "exactly one prompt per request is supported")
            prompt = body.prompt[0]
        else:
            prompt = body.prompt
        tokens = vocab.encode(prompt)
        check_prompt(tokens)
        stream = await start(core, tokens, body.max_tokens, hang=hang, faulted_text=faulted_text)
        rid = f"cmpl-{uuid.uuid4().hex}"
        if body.stream:
            first = await first_or_error(stream, released=released)
            return StreamingResponse(
                completion_chunks(rid, created, model_name, first, stream, released=released),
                media_type="text/event-stream",
            )
        out, finish = await collect(stream, released=released)
        return JSONResponse(
            {
                "id": rid,
                "object": "text_completion",
                "created": int(time.time()),
                "model": model_name,
                "choices": [{"index": 0, "text": vocab.decode(out), "logprobs": None, "finish_reason": finish}],
                "usage": usage(len(tokens), len(out)),
            }
        )

    @router.post("/v1/chat/completions", response_model=None, responses=_COMPLETION_ANSWERS)
    async def chat_completions(body: ChatCompletionRequest) -> Response:
        check_model(body.model)
        max_tokens = body.max_completion_tokens or body.max_tokens or 16
        check_max_tokens(max_tokens)
        messages: list[tuple[str, str]] = [(m.role, text_of(m.content)) for m in body.messages]
        tokens = vocab.encode(vocab.render_chat(messages))
        check_prompt(tokens)
        stream = await start(core, tokens, max_tokens, hang=hang, faulted_text=faulted_text)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        if body.stream:
            first = await first_or_error(stream, released=released)
            return StreamingResponse(
                chat_chunks(rid, created, model_name, first, stream, released=released), media_type="text/event-stream"
            )
        out, finish = await collect(stream, released=released)
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
                "usage": usage(len(tokens), len(out)),
            }
        )

    return router


def ft_router(core: EngineCore, *, profile: EngineProfile, prefix: str) -> APIRouter:
    """The FT status and apply routes under ``prefix``; a well-formed command is 202 whether the engine accepts
    it or rejects it (the outcome is read from the status route)."""
    router = APIRouter()
    released = profile.name == "vllm-0.32"
    vllm_body = profile.error_body == "vllm"

    @router.get(status_path(prefix), responses=_errors(PlainErrorOut, 401))
    async def ft_status() -> dict[str, Any]:
        answer = core.ft_status()
        return {**answer.wire(), "engines": [wire_entry(e, profile) for e in answer.engines]}

    # vLLM's bodies: its error shape for 400 and 413 (0.32 and 0.34), a plain one for --api-key's 401
    refusals = _errors(OpenAiErrorOut if vllm_body or released else PlainErrorOut, 400, 413)

    @router.post(
        apply_path(prefix),
        status_code=202,
        responses={202: {"model": ApplyAccepted}, **refusals, **_errors(PlainErrorOut, 401)},
        openapi_extra=json_request_body(ApplyRequest),
    )
    async def ft_apply(request: Request) -> JSONResponse:
        raw = await request.body()
        if released:
            return released_apply(request, raw)
        if vllm_body:
            return v034_apply(request, raw)
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

    def media_or_json_error(request: Request, raw: bytes) -> JSONResponse | object:
        """vLLM's checks before the payload: the media type, then the JSON; the parsed body when both pass."""
        media = request.headers.get("content-type", "").lower().split(";", maxsplit=1)[0].strip()
        if media != "application/json":
            return JSONResponse(
                profile.error_body_for(
                    "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed"
                ),
                status_code=400,
            )
        try:
            parsed: object = json.loads(raw)
        except (ValueError, RecursionError):
            return JSONResponse(profile.error_body_for("Invalid JSON format"), status_code=400)
        return parsed

    def v034_apply(request: Request, raw: bytes) -> JSONResponse:
        """vLLM 0.34: as 0.32, plus a required non-empty ``request_id``, the caller's, echoed in the 202."""
        body = media_or_json_error(request, raw)
        if isinstance(body, JSONResponse):
            return body
        try:
            command = parse_v034_apply(body)
        except ProtocolError as exc:
            return JSONResponse(profile.error_body_for(str(exc)), status_code=400)
        core.apply(command)
        return JSONResponse({"message": profile.accepted_message, "request_id": command.request_id}, status_code=202)

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

    return router


def elastic_ep_router(core: EngineCore, *, profile: EngineProfile) -> APIRouter:
    """vLLM 0.34's elastic EP routes (``--enable-elastic-ep``, external-LB mode; ``entrypoints/serve/elastic_ep/
    api_router.py``): ``POST /scale_elastic_ep`` and ``POST /is_scaling_elastic_ep``.

    The scale answers 200 ``{"message": "Scaled to N data parallel engines"}`` (also, at once and without an
    epoch, for the current size), 400 for a bad body or a ``ValueError`` of the scale (the max size, the
    experts: vLLM's texts), 408 "Scale failed due to request drain timeout after {drain_timeout} seconds" for any
    ``TimeoutError`` (vLLM answers that text for its ready-barrier timeout too, L71-76) and 500 "Scale failed" for
    every other failure (L77-81); the reason is in the status route's ``error``. The serving gate while scaling
    or retired is :class:`~heteroflow.engine_sim.assembly.ElasticEpGate`.
    """
    router = APIRouter()

    @router.post(SCALE_ELASTIC_EP_PATH, responses=_errors(OpenAiErrorOut, 400, 401, 408, 500))
    async def scale(request: Request) -> JSONResponse:
        raw = await request.body()
        media = request.headers.get("content-type", "").lower().split(";", maxsplit=1)[0].strip()
        if media != "application/json":  # validate_json_request (api_router.py L30)
            message = "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed"
            return JSONResponse(profile.error_body_for(message), status_code=400)
        try:
            body: object = json.loads(raw)
        except (ValueError, RecursionError):
            return JSONResponse(profile.error_body_for("Invalid JSON format"), status_code=400)
        try:
            new_size, drain_timeout = parse_scale_elastic_ep(body)
        except ProtocolError as exc:
            return JSONResponse(profile.error_body_for(str(exc)), status_code=400)
        try:
            await core.scale_elastic_ep(new_size)
        except TimeoutError:
            # what the release answers for every TimeoutError of the scale, including its ready barrier's
            text = elastic_ep_drain_timeout_text(drain_timeout)
            return JSONResponse(profile.error_body_for(text, status_code=408), status_code=408)
        except ElasticEpRefusal as exc:
            return JSONResponse(profile.error_body_for(str(exc)), status_code=400)
        except ElasticEpFailedError:
            return JSONResponse(profile.error_body_for("Scale failed", status_code=500), status_code=500)
        return JSONResponse({"message": f"Scaled to {new_size} data parallel engines"})

    @router.post(IS_SCALING_ELASTIC_EP_PATH, responses=_errors(PlainErrorOut, 401))
    async def is_scaling() -> dict[str, Any]:
        status = core.elastic_status()
        return {**status.model_dump(), "is_scaling_elastic_ep": status.phase in ("preparing", "committing")}

    return router


def sim_router(core: EngineCore, *, gate: TokenGate) -> APIRouter:
    """Fault injection and the engine's facts: closed (403) with no cluster token configured, else the token.

    The assembly's middleware checks the token before the body is read; the check here is the same gate, so
    that the routes are closed even in an app built without that middleware.
    """
    router = APIRouter()

    def require_token(request: Request) -> None:
        if not gate.token:
            raise SimAuthError(403, FAULT_INJECTION_DISABLED)
        refusal = gate.refusal(request.url.path, request.headers.get("authorization"))
        if refusal is not None:
            raise SimAuthError(401, refusal)

    @router.post(f"{SIM_PREFIX}/faults", status_code=202, responses=_errors(PlainErrorOut, 400, 401, 403, 413))
    async def inject(body: FaultInjection, request: Request) -> dict[str, Any]:
        require_token(request)
        core.inject(body.kind, delay_sec=body.delay_sec)
        return {"injected": body.kind.value, "dp_rank": core.state.rank}

    @router.get(f"{SIM_PREFIX}/info", responses=_errors(PlainErrorOut, 400, 401, 403))
    async def info(request: Request) -> dict[str, Any]:
        require_token(request)
        return core.info()

    return router
