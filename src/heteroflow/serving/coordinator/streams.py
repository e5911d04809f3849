"""Server-sent events of an OpenAI stream, fault answers, and the continuation of a cut stream. Purely
computational.

- :func:`split_event` and :class:`Event`: one SSE event at a time, its JSON payload read once (the text it
  carries, its ``finish_reason`` values, whether it is an error event or ``[DONE]``).
- :func:`is_abort_answer`: a non-streaming 200 with a choice that ended with ``finish_reason: "abort"`` (what a
  released vLLM answers for a request its fault aborted, with the text it had produced by then) is a fault, not a
  success: the client has been sent nothing of a buffered answer, so the whole request goes elsewhere.
- :class:`StreamContext`: what the client has been sent of one stream (its id, the text, the events that
  carried text), and :meth:`StreamContext.continuation`, the body that resumes it on another engine: the
  prompt plus the text already sent (chat: the partial assistant message, continued), the remaining
  ``max_tokens``, every other parameter unchanged. :meth:`StreamContext.splice` rewrites a continuation's
  events so that the client sees one stream: the first stream's ``id`` and ``created``, no second role event.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

DONE = b"data: [DONE]\n\n"
_SEPARATORS = (b"\n\n", b"\r\n\r\n")
_COMPLETIONS_DEFAULT_MAX_TOKENS = 16
"""OpenAI's default ``max_tokens`` of a completion (vLLM's too)."""


def split_event(buffer: bytes) -> int:
    """Length of the first complete SSE event in ``buffer`` (separator included), 0 if none ends yet."""
    ends = [found + len(sep) for sep in _SEPARATORS if (found := buffer.find(sep)) >= 0]
    return min(ends, default=0)


@dataclass(frozen=True, slots=True)
class Event:
    """One SSE event as the engine sent it, and what it means for the relay."""

    raw: bytes
    payload: dict[str, Any] | None = None
    """The JSON object of its ``data:`` lines; ``None`` for ``[DONE]``, comments and anything not JSON."""
    done: bool = False

    @classmethod
    def parse(cls, raw: bytes) -> Event:
        data = b"\n".join(
            line[5:].lstrip(b" ") for line in raw.replace(b"\r\n", b"\n").split(b"\n") if line.startswith(b"data:")
        )
        if data.strip() == b"[DONE]":
            return cls(raw, None, done=True)
        try:
            payload = json.loads(data) if data else None
        except ValueError:
            payload = None
        return cls(raw, payload if isinstance(payload, dict) else None)

    @property
    def error(self) -> bool:
        return self.payload is not None and "error" in self.payload

    def choices(self) -> list[dict[str, Any]]:
        found = self.payload.get("choices") if self.payload is not None else None
        return [c for c in found if isinstance(c, dict)] if isinstance(found, list) else []

    @property
    def text(self) -> str:
        """The output this event carries (completions: ``text``; chat: ``delta.content``)."""
        parts = []
        for choice in self.choices():
            delta = choice.get("delta")
            value = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            if isinstance(value, str):
                parts.append(value)
        return "".join(parts)

    @property
    def tool_calls(self) -> bool:
        return any(isinstance(c.get("delta"), dict) and c["delta"].get("tool_calls") for c in self.choices())

    @property
    def finish_reasons(self) -> list[str]:
        return [str(c["finish_reason"]) for c in self.choices() if c.get("finish_reason") is not None]

    @property
    def aborted(self) -> bool:
        return "abort" in self.finish_reasons

    @property
    def role_only(self) -> bool:
        """A chat stream's opening event: the assistant role, no content, no finish."""
        choices = self.choices()
        return bool(choices) and all(
            isinstance(c.get("delta"), dict)
            and c["delta"].get("role")
            and not c["delta"].get("content")
            and c.get("finish_reason") is None
            for c in choices
        )


def is_abort_answer(body: bytes) -> bool:
    """A 200 answer with a choice that ended with ``abort`` (released vLLM's answer to a request its fault
    aborted): a fault, to be sent elsewhere. Its text, when it has some, is what the engine had generated before
    the fault (observed on real vLLM 0.32 ranks): an incomplete answer, never a success."""
    try:
        answer = json.loads(body)
    except ValueError:
        return False
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list):
        return False
    return any(isinstance(choice, dict) and choice.get("finish_reason") == "abort" for choice in choices)


def _not_continuable(route: str, body: dict[str, Any]) -> str | None:
    """Why a stream of this request cannot be resumed elsewhere (``None``: it can)."""
    if (body.get("n") or 1) != 1 or (body.get("best_of") or 1) != 1:
        return "it asks for several choices (n > 1)"
    if route == "completions":
        if body.get("logprobs") is not None:
            return "it asks for logprobs"
        if body.get("echo"):
            return "it asks for the prompt to be echoed"
        prompt = body.get("prompt")
        if not (
            isinstance(prompt, str) or (isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str))
        ):
            return "its prompt is not one text"
        if body.get("suffix"):
            return "it has a suffix"
        return None
    if body.get("logprobs") or body.get("top_logprobs"):
        return "it asks for logprobs"
    if not isinstance(body.get("messages"), list):
        return "it has no message list"
    return None


@dataclass
class StreamContext:
    """One streamed answer as its client has received it so far."""

    route: str
    """``completions`` or ``chat_completions``."""
    body: dict[str, Any] | None
    """The client's request, parsed; ``None`` when it could not be (then no continuation)."""
    stream_id: str | None = None
    created: object = None
    text: str = ""
    text_events: int = 0
    """Events that carried output: one token each, as vLLM and the simulator stream them by default."""
    finished: bool = False
    """A ``finish_reason`` other than ``abort`` was relayed."""
    segments: int = 1
    tool_calls: bool = False
    role_sent: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def note(self, event: Event) -> None:
        """Account for one event relayed to the client."""
        if event.payload is not None:
            if self.stream_id is None and isinstance(event.payload.get("id"), str):
                self.stream_id = event.payload["id"]
                self.created = event.payload.get("created")
            if event.role_only:
                self.role_sent = True
        text = event.text
        if text:
            self.text += text
            self.text_events += 1
        if event.tool_calls:
            self.tool_calls = True
        if any(reason != "abort" for reason in event.finish_reasons):
            self.finished = True

    def why_not_continuable(self) -> str | None:
        if self.body is None:
            return "its body could not be read"
        if self.tool_calls:
            return "it was streaming a tool call"
        return _not_continuable(self.route, self.body)

    def remaining_tokens(self) -> int | None:
        """``max_tokens`` left for a continuation (``None``: the request set no bound)."""
        assert self.body is not None
        if self.route == "completions":
            asked = self.body.get("max_tokens")
            asked = _COMPLETIONS_DEFAULT_MAX_TOKENS if asked is None else asked
        else:
            asked = self.body.get("max_completion_tokens") or self.body.get("max_tokens")
        if not isinstance(asked, int) or isinstance(asked, bool):
            return None
        return asked - self.text_events

    def continuation(self, remaining: int | None) -> bytes:
        """The body that resumes the stream on another engine (see the module docstring)."""
        assert self.body is not None
        body = dict(self.body)
        body["stream"] = True
        if self.route == "completions":
            prompt = body["prompt"] if isinstance(body["prompt"], str) else body["prompt"][0]
            body["prompt"] = prompt + self.text
            if remaining is not None:
                body["max_tokens"] = remaining
        else:
            messages = list(body["messages"])
            if self.text:
                messages.append({"role": "assistant", "content": self.text})
                body["add_generation_prompt"] = False
                body["continue_final_message"] = True
            body["messages"] = messages
            if remaining is not None:
                if "max_completion_tokens" in body and body["max_completion_tokens"] is not None:
                    body["max_completion_tokens"] = remaining
                else:
                    body["max_tokens"] = remaining
        return json.dumps(body).encode("utf-8")

    def splice(self, event: Event) -> bytes | None:
        """A continuation's event as the client must see it (``None``: drop it)."""
        if event.done or event.payload is None:
            return event.raw
        if event.role_only and self.role_sent:
            return None
        payload = dict(event.payload)
        if self.stream_id is not None:
            payload["id"] = self.stream_id
            if self.created is not None:
                payload["created"] = self.created
        return b"data: " + json.dumps(payload).encode("utf-8") + b"\n\n"

    def final_events(self) -> bytes:
        """The end of a stream whose ``max_tokens`` was used up when it was cut: a ``length`` finish and
        ``[DONE]``, as the engine would have sent them."""
        if self.route == "completions":
            choice: dict[str, Any] = {"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}
            kind = "text_completion"
        else:
            choice = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}
            kind = "chat.completion.chunk"
        model = self.body.get("model") if self.body is not None else None
        payload = {"id": self.stream_id, "object": kind, "created": self.created, "model": model, "choices": [choice]}
        return b"data: " + json.dumps(payload).encode("utf-8") + b"\n\n" + DONE
