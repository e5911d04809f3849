"""The official ``openai`` client as load: threads that each send one completion after the other with
``max_retries=0`` (no client-side retry, so every failure the Coordinator lets through is counted), half of
them streaming. Shared by ``tests/e2e/test_client_faults.py`` and ``bench/openai_clients.py``.

Counted per request: ``ok`` (an answer with text, or a stream ending with a ``finish_reason`` other than
``abort``), ``abort`` (a ``finish_reason: "abort"`` answer), ``error:<type>`` (the client raised: an HTTP error
status or a transport error, or an error event ended a stream), ``empty`` (an answer without text). An HTTP error's
detail starts with its ``Retry-After`` when it had one. Every request is also kept with its start and latency.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import openai

from heteroflow.local import ClusterState


@dataclass(frozen=True)
class Timed:
    """One request as its client saw it."""

    started_sec: float
    """When it was sent, in seconds since the lanes started."""
    latency_sec: float
    """From sending it to its last byte (or the client's exception)."""
    outcome: str
    detail: str


@dataclass
class Tally:
    outcomes: Counter[str] = field(default_factory=Counter)
    failures: list[tuple[float, str, str]] = field(default_factory=list)
    """(seconds since the start, outcome, detail) of every request that did not end ``ok``."""
    requests: list[Timed] = field(default_factory=list)
    """Every request, in the order they ended."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, outcome: str, detail: str, at: float, *, latency: float = 0.0) -> None:
        with self.lock:
            self.outcomes[outcome] += 1
            self.requests.append(Timed(at - latency, latency, outcome, detail[:300]))
            if outcome != "ok":
                self.failures.append((at, outcome, detail[:200]))

    def snapshot(self) -> list[Timed]:
        with self.lock:
            return list(self.requests)


def status_failure(exc: openai.APIStatusError) -> tuple[str, str]:
    """``(outcome, detail)`` of an HTTP error status; the detail starts with ``[Retry-After: …]`` when it had one."""
    retry_after = exc.response.headers.get("retry-after")
    prefix = f"[Retry-After: {retry_after}] " if retry_after is not None else ""
    return f"error:http_{exc.status_code}", prefix + str(exc)


def one_chat_stream(client: openai.OpenAI, model: str, *, max_tokens: int) -> tuple[str, str]:
    """``(outcome, detail)`` of one streamed chat completion as the client saw it."""
    try:
        text: list[str] = []
        finish: str | None = None  # a str: vLLM also sends "abort", which the SDK's literal type leaves out
        for chunk in client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "the survivors keep serving"}],
            max_tokens=max_tokens,
            stream=True,
        ):
            for choice in chunk.choices:
                text.append(choice.delta.content or "")
                finish = choice.finish_reason or finish
        if finish == "abort":
            return "abort", "stream finished with abort"
        if finish is None:
            return "error:no_finish_reason", "stream ended without a finish_reason"
        return ("ok", "") if "".join(text) else ("empty", f"finish_reason {finish}, no text")
    except openai.APIStatusError as exc:
        return status_failure(exc)
    except openai.APIError as exc:
        return f"error:{type(exc).__name__}", str(exc)


def one_request(
    client: openai.OpenAI, model: str, *, stream: bool, max_tokens: int, extra_body: dict[str, object] | None = None
) -> tuple[str, str]:
    """``(outcome, detail)`` of one completion as the client saw it (``extra_body``: engine-specific fields)."""
    prompt = "the survivors keep serving"
    try:
        if stream:
            text: list[str] = []
            finish: str | None = None  # a str: vLLM also sends "abort", which the SDK's literal type leaves out
            for chunk in client.completions.create(
                model=model, prompt=prompt, max_tokens=max_tokens, stream=True, extra_body=extra_body
            ):
                for choice in chunk.choices:
                    text.append(choice.text or "")
                    finish = choice.finish_reason or finish
            if finish == "abort":
                return "abort", "stream finished with abort"
            if finish is None:
                return "error:no_finish_reason", "stream ended without a finish_reason"
            return ("ok", "") if "".join(text) else ("empty", f"finish_reason {finish}, no text")
        answer = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, extra_body=extra_body)
        choice = answer.choices[0]
        reason: str = choice.finish_reason  # vLLM also sends "abort", which the SDK's literal type leaves out
        if reason == "abort":
            return "abort", "finish_reason abort"
        return ("ok", "") if choice.text else ("empty", f"finish_reason {choice.finish_reason}, no text")
    except openai.APIStatusError as exc:
        return status_failure(exc)
    except openai.APIError as exc:
        return f"error:{type(exc).__name__}", str(exc)


def lanes(
    state: ClusterState,
    tally: Tally,
    stop: threading.Event,
    *,
    threads: int,
    max_tokens: int,
    timeout_sec: float = 120.0,
    extra_body: dict[str, object] | None = None,
) -> list[threading.Thread]:
    """``threads`` clients (lane 4k+3 streams chat, other odd lanes stream completions) until ``stop``;
    ``timeout_sec`` is each client's own timeout, ``extra_body`` goes with every completion."""
    began = time.monotonic()
    model = state.instances[0].model

    def lane(index: int) -> None:
        client = openai.OpenAI(
            base_url=state.coordinator_url + "/v1",
            api_key=state.api_key or state.admin_token,
            max_retries=0,
            timeout=timeout_sec,
        )
        with client:
            while not stop.is_set():
                sent = time.monotonic()
                if index % 4 == 3:  # every other streaming lane streams chat completions
                    outcome, detail = one_chat_stream(client, model, max_tokens=max_tokens)
                else:
                    outcome, detail = one_request(
                        client, model, stream=index % 2 == 1, max_tokens=max_tokens, extra_body=extra_body
                    )
                ended = time.monotonic()
                tally.add(outcome, detail, ended - began, latency=ended - sent)

    started = [threading.Thread(target=lane, args=(i,), daemon=True) for i in range(threads)]
    for thread in started:
        thread.start()
    return started
