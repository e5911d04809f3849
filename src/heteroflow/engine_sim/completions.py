"""The simulated engine's answers to the OpenAI routes: the errors in vLLM's shape, the start of a generation,
and the completion bodies and server-sent events (used by :mod:`.routes`).

Released vLLM ends a request its fault aborted with 200 ``finish_reason: "abort"`` and no text (``released``
here, both profiles); a new request to a faulted engine waits until it serves again (``hang``, vLLM 0.32) or
gets 503 with vLLM's own text (``faulted_text``, vLLM 0.34).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse

from heteroflow.engine_sim import vocab
from heteroflow.engine_sim.engine import EngineCore, EngineUnavailableError, RequestAbortedError

MAX_PROMPT_TOKENS = 2048
"""The worker prefills between two lockstep steps; a longer prompt would stall every peer's collective."""


class OpenAiError(Exception):
    """An OpenAI route's refusal, answered as vLLM does: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status_code: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.kind = kind
        self.message = message


def openai_error_body(status_code: int, kind: str, message: str) -> dict[str, object]:
    return {"error": {"message": message, "type": kind, "param": None, "code": status_code}}


def openai_error(status_code: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse(openai_error_body(status_code, kind, message), status_code=status_code)


def text_of(content: str | list[dict[str, Any]]) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise OpenAiError(400, "BadRequestError", "only text content parts are supported")
        parts.append(part["text"])
    return "".join(parts)


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


HANG_POLL_SEC = 0.05
"""How often a request held by a faulted released-profile engine looks whether the engine serves again."""


async def start(
    core: EngineCore,
    tokens: tuple[int, ...],
    max_tokens: int,
    *,
    hang: bool = False,
    faulted_text: str | None = None,
) -> AsyncIterator[int]:
    if hang:
        # vLLM 0.32 refuses nothing: a new request to a faulted engine waits until it serves again or exits
        while not core.state.serving:  # noqa: ASYNC110 - serving changes in many transitions; a poll is plainer
            await asyncio.sleep(HANG_POLL_SEC)
    if not core.state.serving:
        message = faulted_text or f"engine is {core.state.health}; retry elsewhere"
        raise OpenAiError(503, "ServiceUnavailableError", message)
    return core.generate(prompt_tokens=tokens, max_tokens=max_tokens)


async def first_or_error(stream: AsyncIterator[int], *, released: bool = False) -> int | None:
    """The first token, so that a stream that cannot start answers 503 instead of a broken stream
    (released vLLM: ``None``, a stream that ends at once with ``finish_reason: "abort"``)."""
    try:
        return await anext(stream)
    except StopAsyncIteration:
        return None
    except (EngineUnavailableError, RequestAbortedError) as exc:
        if released:
            return None
        raise OpenAiError(503, "ServiceUnavailableError", str(exc)) from exc


async def collect(stream: AsyncIterator[int], *, released: bool = False) -> tuple[list[int], str]:
    """The tokens and the finish reason; an abort is a 503, or (released vLLM) 200 ``abort`` with no text."""
    out: list[int] = []
    try:
        async for token in stream:
            out.append(token)
    except (EngineUnavailableError, RequestAbortedError) as exc:
        if released:
            return [], "abort"
        raise OpenAiError(503, "ServiceUnavailableError", f"request aborted: {exc}") from exc
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


async def completion_chunks(
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


async def chat_chunks(
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
