"""Check the table of today's figures at the top of ``docs/benchmarks.md``: every headline has a command that exists.

The table lies between ``<!-- headlines: start -->`` and ``<!-- headlines: end -->``. Each row must fill every
column; its *command* must name, in backticks, a script of this repository that exists (``bench/<name>.py``,
``scripts/<name>`` or a path under ``tests/``), so that the figure can be produced again; its *met?* is ``met``,
``not met`` or ``—`` (no target); its tree is a commit (in backticks) or ``not recorded``. Exit code 1 and one line
per problem when a row fails, 0 and the number of headlines when every row passes::

    .venv/bin/python bench/headlines.py [--file docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
START = "<!-- headlines: start -->"
END = "<!-- headlines: end -->"
COLUMNS = ("headline", "today's figure", "target", "met?", "command", "tree", "date", "machine", "load average")
VERDICTS = frozenset({"met", "not met", "**not met**", "—"})
_SCRIPT = re.compile(r"(?:^|[\s=])((?:bench|scripts|tests)/[\w./-]*\w)")
_CODE = re.compile(r"`([^`]+)`")
_TREE = re.compile(r"^`[0-9a-f]{7,40}`$")


@dataclass(frozen=True)
class Headline:
    """One row of the table, its cells by column name."""

    line: int
    cells: dict[str, str]

    @property
    def name(self) -> str:
        return self.cells["headline"]


class TableError(ValueError):
    """The table is missing or is not the table of headlines."""


def _cells(row: str) -> list[str]:
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


def read_headlines(text: str) -> list[Headline]:
    """The rows of the headline table in ``text``; :class:`TableError` when there is none or its header differs."""
    lines = text.splitlines()
    try:
        start, end = lines.index(START), lines.index(END)
    except ValueError as exc:
        raise TableError(f"no {START} … {END} block") from exc
    table = [(number, line) for number, line in enumerate(lines[start + 1 : end], start=start + 2) if line.strip()]
    if len(table) < 2 or tuple(_cells(table[0][1])) != COLUMNS:
        raise TableError(f"the table's header is not | {' | '.join(COLUMNS)} |")
    return [Headline(line=number, cells=dict(zip(COLUMNS, _cells(row), strict=False))) for number, row in table[2:]]


def scripts_of(command: str) -> list[str]:
    """The repository paths a command cell names inside its backticks (``bench/…``, ``scripts/…``, ``tests/…``)."""
    return [path for code in _CODE.findall(command) for path in _SCRIPT.findall(code)]


def problems(headlines: list[Headline], *, repo: Path) -> list[str]:
    """Every way a row fails the rules above, one line each (empty when all pass)."""
    found: list[str] = []
    if not headlines:
        found.append("the table has no headline")
    for row in headlines:
        where = f"line {row.line} ({row.name or 'no headline'})"
        if len(row.cells) != len(COLUMNS) or any(not value for value in row.cells.values()):
            empty = [column for column in COLUMNS if not row.cells.get(column)]
            found.append(f"{where}: empty or missing cells: {', '.join(empty)}")
            continue
        paths = scripts_of(row.cells["command"])
        if not paths:
            found.append(f"{where}: the command names no script of the repository in backticks")
        found.extend(f"{where}: {path} does not exist" for path in paths if not (repo / path).exists())
        if row.cells["met?"] not in VERDICTS:
            found.append(f"{where}: met? is {row.cells['met?']!r}, not met / not met / —")
        tree = row.cells["tree"]
        if tree != "not recorded" and not _TREE.fullmatch(tree):
            found.append(f"{where}: tree {tree!r} is neither a commit in backticks nor 'not recorded'")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--file", type=Path, default=REPO / "docs" / "benchmarks.md", help="the benchmarks page")
    args = parser.parse_args()
    try:
        headlines = read_headlines(args.file.read_text(encoding="utf-8"))
    except (OSError, TableError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    found = problems(headlines, repo=REPO)
    for problem in found:
        print(f"error: {problem}", file=sys.stderr)
    if found:
        return 1
    print(f"{len(headlines)} headlines, each with a command that exists")
    return 0


if __name__ == "__main__":
    sys.exit(main())
