"""The repository stands alone: every requirement id the code cites is defined in ``docs/design/``, and nothing
in the code or the docs points outside the repository (``docs/design/README.md``, D-51).

Ids are collected from ``src`` and from the docs, tests and benchmarks that cite them too (:data:`CITING`).

How an id is recognised — one regular expression, :data:`ID_PATTERN`, with three alternatives:

- ``F-nn``, ``H-nn``, ``D-nn``: a serving requirement, a GPU health requirement, a design decision. The id must
  stand alone (``\\b`` on both sides), so ``UTF-8``, ``SHA-256`` or ``ISO-8601`` are not ids;
- ``§n`` or ``§n.m`` (a space after ``§`` is allowed): a section of the RFC. Every ``§`` in ``src`` is the RFC's,
  also the bare one in "RFC §4.4 and §6";
- ``A1`` … ``A18`` standing alone: a row of the acceptance matrix (``A100`` or ``0xA1`` are not rows).

A range (``F-23…F-27``, ``A5-A7``) is checked by its two ends. An id is *defined* when a markdown file in
``docs/design/`` has a heading that starts with it (``### F-12 …``, ``## §4.4 …``) or a table row whose first cell
is it (``| A13 | … |``).
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DESIGN = REPO / "docs" / "design"

ID_PATTERN = re.compile(
    r"""
      (?<!\w)[FHD]-\d+(?!\w)               # F-12, H-3, D-14 (not UTF-8, SHA-256, ISO-8601)
    | §\ ?\d+(?:\.\d+)*                    # RFC §4.4, §6 (a sentence's final dot is not part of it)
    | (?<!\w)A(?:1[0-8]|[1-9])(?!\w)       # acceptance rows A1 … A18 (not A100, 0xA1)
    """,
    re.VERBOSE,
)

#: Where a missing id of each kind belongs.
HOME = {"F": "serving-ft.md", "A": "serving-ft.md", "H": "health.md", "D": "decisions.md", "§": "rfc-dp-scale-down.md"}

#: Where ids are cited: the code first, and the docs and tests that explain and check it.
CITING = ("src", "docs", "tests", "bench", "README.md", "ARCHITECTURE.md")

#: Text that points outside the repository (the specification and design folders the code grew from).
OUTSIDE = ("shared/spec", "shared/seeds", "../shared", "/work/shared")
#: What must stand alone: the code, the docs, and everything that ships with them. ``tests`` may read real tool
#: captures from beside the checkout when they are there (D-50), so it is not scanned.
SELF_CONTAINED = ("src", "docs", "bench", "deploy", "scripts", "README.md", "ARCHITECTURE.md", "Dockerfile")

TEXT_SUFFIXES = {".py", ".js", ".mjs", ".html", ".css", ".md", ".txt", ".yaml", ".yml", ".json", ".toml", ".ini", ""}


def normalise(raw: str) -> str:
    return raw.replace("§ ", "§")


def text_files(*roots: str) -> list[Path]:
    files: list[Path] = []
    for root in roots:
        path = REPO / root
        candidates = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        # build and tool outputs (an editable install's egg-info, caches) are not the repository's text
        files += [
            p
            for p in candidates
            if p.suffix in TEXT_SUFFIXES
            and not any(
                part == "__pycache__" or part.endswith(".egg-info") or part.startswith(".")
                for part in p.relative_to(REPO).parts
            )
        ]
    return files


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def cited_ids(*roots: str) -> dict[str, list[str]]:
    """Every id cited under ``roots`` (this file's examples aside) → the ``path:line`` places that cite it."""
    places: dict[str, list[str]] = defaultdict(list)
    for path in text_files(*roots):
        if path == Path(__file__).resolve():
            continue
        for number, line in enumerate(read(path).splitlines(), start=1):
            for match in ID_PATTERN.finditer(line):
                places[normalise(match.group())].append(f"{path.relative_to(REPO)}:{number}")
    return places


_HEADING = re.compile(r"^#{1,6}[ \t]+(?P<head>\S+(?:[ \t]\S+)?)")
_TABLE_ROW = re.compile(r"^\|[ \t]*(?P<cell>[^|]+?)[ \t]*\|")


def defined_ids() -> dict[str, list[str]]:
    """Every id defined in ``docs/design/`` → the ``path:line`` places that define it."""
    places: dict[str, list[str]] = defaultdict(list)
    for path in sorted(DESIGN.glob("*.md")):
        for number, line in enumerate(read(path).splitlines(), start=1):
            heading, row = _HEADING.match(line), _TABLE_ROW.match(line)
            start = heading.group("head") if heading else row.group("cell") if row else None
            if start is None:
                continue
            match = ID_PATTERN.match(start)
            if match and (row is None or match.group() == start):
                places[normalise(match.group())].append(f"{path.relative_to(REPO)}:{number}")
    return places


def test_the_pattern_finds_exactly_the_ids_of_a_sentence() -> None:
    text = (
        "RFC §4.4 and § 6; F-23…F-27, H-3-H-4, D-12; rows A5-A7 and A18; RFC §5. "
        "Not ids: UTF-8, SHA-256, ISO-8601, H100, A100, 0xA1, GPU-0, A19, §x"
    )
    found = [normalise(m.group()) for m in ID_PATTERN.finditer(text)]
    assert found == ["§4.4", "§6", "F-23", "F-27", "H-3", "H-4", "D-12", "A5", "A7", "A18", "§5"]


def test_src_cites_requirement_ids() -> None:
    """A guard on the guard: if the pattern stopped matching, the next test would pass vacuously."""
    kinds = {normalise(rid)[0] for rid in cited_ids("src")}
    assert {"F", "H", "§", "A"} <= kinds


def test_every_requirement_id_cited_is_defined_in_docs_design() -> None:
    """Every id in ``src`` (and in the docs and tests around it) names a definition in ``docs/design/``."""
    defined = defined_ids()
    missing = {rid: where for rid, where in cited_ids(*CITING).items() if rid not in defined}
    report = [
        f"{'RFC ' if rid[0] == '§' else ''}{rid} is cited at {', '.join(where[:5])}{' …' if len(where) > 5 else ''} "
        f"but not defined in docs/design/: add a heading '### {rid} …' (or a table row '| {rid} | … |') to "
        f"docs/design/{HOME[rid[0]]}"
        for rid, where in sorted(missing.items())
    ]
    assert not report, "\n".join(report)


def test_every_id_is_defined_once() -> None:
    twice = {rid: where for rid, where in defined_ids().items() if len(where) > 1}
    assert not twice, "\n".join(f"{rid} is defined more than once: {', '.join(where)}" for rid, where in twice.items())


@pytest.mark.parametrize("kind", ["F", "H", "D", "§", "A"])
def test_each_kind_of_id_is_defined_in_its_own_page(kind: str) -> None:
    pages = {where.split(":")[0] for rid, places in defined_ids().items() if rid[0] == kind for where in places}
    assert pages == {f"docs/design/{HOME[kind]}"}


def test_nothing_points_outside_the_repository() -> None:
    hits = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in text_files(*SELF_CONTAINED)
        for number, line in enumerate(read(path).splitlines(), start=1)
        if any(outside in line for outside in OUTSIDE)
    ]
    assert not hits, "these lines point outside the repository (use docs/design/ instead):\n" + "\n".join(hits)


_DOCUMENT = re.compile(r"(?<![\w./-])((?:[\w.-]+/)*[\w-]+\.md)\b")


def test_every_document_named_in_src_exists() -> None:
    """``serving-ft.md``, ``docs/controller.md``: a document the code names is a file of this repository."""
    known = {p.name for p in (REPO / "docs").rglob("*.md")} | {p.name for p in REPO.glob("*.md")}
    missing = sorted(
        f"{path.relative_to(REPO)}:{number}: {name}"
        for path in text_files("src")
        for number, line in enumerate(read(path).splitlines(), start=1)
        for name in _DOCUMENT.findall(line)
        if not ((REPO / name).is_file() if "/" in name else name in known)
    )
    assert not missing, "documents named in src that the repository lacks:\n" + "\n".join(missing)
