"""The simulated model's vocabulary: one token per character, so outputs are readable and exact."""

from __future__ import annotations

ALPHABET = " abcdefghijklmnopqrstuvwxyz0123456789.,;:!?'-\n"
UNKNOWN = ALPHABET.index("?")
VOCAB_SIZE = len(ALPHABET)
_INDEX = {ch: i for i, ch in enumerate(ALPHABET)}


def encode(text: str) -> tuple[int, ...]:
    """Token ids of ``text`` (lower-cased; characters outside the alphabet become ``?``)."""
    return tuple(_INDEX.get(ch, UNKNOWN) for ch in text.lower())


def decode(tokens: tuple[int, ...] | list[int]) -> str:
    return "".join(ALPHABET[t] for t in tokens)


def render_chat(messages: list[tuple[str, str]]) -> str:
    """The prompt of a chat: one ``role: content`` line per message, then ``assistant:``."""
    lines = [f"{role}: {content}" for role, content in messages]
    return "\n".join([*lines, "assistant:"])
