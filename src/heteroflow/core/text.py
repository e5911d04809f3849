"""Text that may travel on: what a field, a log line, a database row or a Prometheus label can carry as it is.

Lone UTF-16 surrogates, C0/C1 controls and bidirectional controls are refused in identifiers and names,
wherever they enter; the rule and its reasons live with the wire contracts (``heteroflow.contracts.text``),
whose validators apply it too. Purely computational, no I/O.
"""

from __future__ import annotations

from heteroflow.contracts.text import REFUSED_TEXT, text_problem

__all__ = ["printable", "text_problem"]


def printable(value: str) -> str:
    """``value`` with every refused character replaced by its escape (``\\x00``, ``\\u202e``): what a Prometheus
    label or a log shows of an untrusted string. Idempotent on clean text."""
    return REFUSED_TEXT.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), value)
