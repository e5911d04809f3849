"""Text that may travel on: what a field, a log line, a database row or a Prometheus label can carry as it is.

Three kinds of character are refused in identifiers and names, wherever they enter:

- lone UTF-16 surrogates (U+D800-U+DFFF): JSON's ``\\ud800`` decodes to one, and nothing can encode it again
  (UTF-8, a database driver, an answer that echoes it: each raises);
- NUL and the other C0/C1 controls: PostgreSQL refuses NUL in text, terminals and logs act on the others;
- bidirectional controls (U+202A-U+202E, U+2066-U+2069, U+200E, U+200F, U+061C): they make a shown name read
  differently from what it is ("Trojan Source").

Part of the wire contracts because a contract's validators refuse these characters (a node's vendor and model
names); ``heteroflow.core.text`` re-exports it for the rest of the code. Purely computational, no I/O.
"""

from __future__ import annotations

import re
from typing import Final

REFUSED_TEXT: Final = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
"""One refused character."""


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot travel on as it is, or ``None``; the reason names the character by its code point,
    so that the message itself is always serialisable."""
    found = REFUSED_TEXT.search(value)
    if found is None:
        return None
    code = ord(found.group())
    if 0xD800 <= code <= 0xDFFF:
        kind = "a lone UTF-16 surrogate"
    elif code in (0x061C, 0x200E, 0x200F) or 0x202A <= code <= 0x202E or 0x2066 <= code <= 0x2069:
        kind = "a bidirectional control"
    else:
        kind = "a control character"
    return f"{kind} (U+{code:04X}) at position {found.start()}"
