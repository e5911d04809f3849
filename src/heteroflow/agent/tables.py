"""Box tables as printed by ``nvidia-smi``-style vendor tools (xpu-smi, cnmon). Pure, total.

Such a table is a banner, a header of one or more ``|``-separated lines, a ``|===|`` rule, then one block
of lines per device separated by ``+---+`` borders. Columns are found by their header label, never by a
fixed position: vendors ship more than one layout.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from heteroflow.agent.parsing import parse_count


@dataclass(frozen=True, slots=True)
class BoxTable:
    header: tuple[str, ...]
    """The header lines between the banner's border and the ``===`` rule."""
    devices: tuple[tuple[str, ...], ...]
    """One tuple of lines per device block, in printed order."""


@dataclass(frozen=True, slots=True)
class ColumnRef:
    """Where a labelled value sits: header line, ``|`` section, and token position in that section."""

    line: int
    section: int
    token: int
    tokens_in_header: int


def cells(line: str) -> list[str]:
    """The ``|``-separated sections of a table line, without the outer borders."""
    stripped = line.strip()
    if stripped.startswith("|"):
        stripped = stripped[1:]
    if stripped.endswith("|"):
        stripped = stripped[:-1]
    return stripped.split("|")


def _is_border(line: str) -> bool:
    stripped = line.strip()
    return len(stripped) > 2 and stripped[0] in "+|" and "-" in stripped and set(stripped) <= set("+-=|")


def _is_rule(line: str) -> bool:
    stripped = line.strip()
    return stripped.startswith("|=") and set(stripped) <= set("|=+")


def find_box_table(lines: Sequence[str], *, start: int) -> BoxTable | None:
    """The first box table at or after line ``start``; ``None`` when there is no ``===`` rule."""
    rule = next((i for i in range(start, len(lines)) if _is_rule(lines[i])), None)
    if rule is None:
        return None
    header: list[str] = []
    i = rule - 1
    while i >= start and lines[i].strip().startswith("|") and not _is_border(lines[i]):
        header.insert(0, lines[i])
        i -= 1
    devices: list[tuple[str, ...]] = []
    block: list[str] = []
    for line in lines[rule + 1 :]:
        stripped = line.strip()
        if _is_border(line):
            if block:
                devices.append(tuple(block))
            block = []
            continue
        if not stripped.startswith("|"):
            break
        block.append(line)
    if block:
        devices.append(tuple(block))
    return BoxTable(header=tuple(header), devices=tuple(devices))


def locate(header: Sequence[str], label: str) -> ColumnRef | None:
    """Where ``label`` (one or more words, case-insensitive) appears in the header, or ``None``."""
    wanted = label.lower().split()
    for line_no, line in enumerate(header):
        for section_no, section in enumerate(cells(line)):
            tokens = section.lower().split()
            for pos in range(len(tokens) - len(wanted) + 1):
                if tokens[pos : pos + len(wanted)] == wanted:
                    return ColumnRef(
                        line=line_no,
                        section=section_no,
                        token=pos,
                        tokens_in_header=len(tokens) - len(wanted) + 1,
                    )
    return None


def value_at(block: Sequence[str], ref: ColumnRef) -> str | None:
    """The token of a device block under a located label.

    The header label counts as one token. When the cell has as many tokens as the header, the position
    maps one to one; otherwise a label that is first (last) in its header section takes the cell's first
    (last) token, because these tools align the outer labels to the section edges. Anything else is
    ambiguous and gives ``None``.
    """
    if ref.line >= len(block):
        return None
    sections = cells(block[ref.line])
    if ref.section >= len(sections):
        return None
    tokens = sections[ref.section].split()
    if not tokens:
        return None
    if len(tokens) == ref.tokens_in_header:
        return tokens[ref.token]
    if ref.token == ref.tokens_in_header - 1:
        return tokens[-1]
    if ref.token == 0:
        return tokens[0]
    return None


def banner_line(lines: Sequence[str], banner: re.Pattern[str]) -> int | None:
    """The index of the first line that carries the tool's banner, or ``None``."""
    return next((i for i, line in enumerate(lines) if banner.search(line)), None)


def device_head(block: Sequence[str]) -> tuple[int, list[str]] | None:
    """A device block's declared index and the other words of its first cell; ``None`` when it has no index."""
    words = cells(block[0])[0].split()
    index = parse_count(words[0]) if words else None
    if index is None or index > 4095:
        return None
    return index, words[1:]
