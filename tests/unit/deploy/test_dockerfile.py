"""Offline checks of the repository's ``Dockerfile`` and ``.dockerignore`` (no Docker daemon needed).

:func:`dockerfile_problems` is a small checker over a line parser that follows Docker's rules for comments and
``\\`` continuations: every base image pinned by digest, a numeric non-root final user, no secret-looking build
argument or variable with a value, and exec-form (JSON) ENTRYPOINT/CMD.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SECRET_NAME = re.compile(r"TOKEN|PASSWORD|PASSWD|SECRET|KEY", re.IGNORECASE)
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


@dataclass(frozen=True, slots=True)
class Instruction:
    keyword: str
    """Upper-cased: FROM, RUN, ENV…"""
    arguments: str
    """Everything after the keyword, continuation lines joined with a space."""
    line: int
    """1-based line of the instruction's first line."""


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions in order. Comment lines are dropped, inside a continuation too (as Docker does)."""
    instructions: list[Instruction] = []
    parts: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not parts):
            continue
        if not parts:
            start = number
        continued = stripped.endswith("\\")
        parts.append(stripped[:-1].strip() if continued else stripped)
        if not continued:
            keyword, _, arguments = " ".join(part for part in parts if part).partition(" ")
            instructions.append(Instruction(keyword.upper(), arguments.strip(), start))
            parts = []
    if parts:
        keyword, _, arguments = " ".join(parts).partition(" ")
        instructions.append(Instruction(keyword.upper(), arguments.strip(), start))
    return instructions


def stages(instructions: list[Instruction]) -> list[list[Instruction]]:
    """The build stages, each starting with its FROM."""
    found: list[list[Instruction]] = []
    for instruction in instructions:
        if instruction.keyword == "FROM":
            found.append([])
        if found:
            found[-1].append(instruction)
    return found


def _from_image(arguments: str) -> tuple[str, str | None]:
    """(image, stage alias) of ``FROM [--platform=…] image [AS alias]``."""
    words = [word for word in arguments.split() if not word.startswith("--")]
    alias = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
    return words[0], alias


def _assignments(keyword: str, arguments: str) -> list[tuple[str, str | None]]:
    """(name, value or None) pairs of an ENV or ARG instruction, both the ``k=v`` and the legacy ``k v`` form."""
    words = shlex.split(arguments)
    if keyword == "ENV" and words and "=" not in words[0]:
        return [(words[0], " ".join(words[1:]))]
    pairs: list[tuple[str, str | None]] = []
    for word in words:
        name, equals, value = word.partition("=")
        pairs.append((name, value if equals else None))
    return pairs


def dockerfile_problems(text: str) -> list[str]:
    """Everything the checker finds wrong, one sentence each (empty when the Dockerfile passes)."""
    instructions = parse_dockerfile(text)
    built = stages(instructions)
    problems: list[str] = []
    if not built:
        return ["no FROM instruction"]
    aliases: set[str] = set()
    for stage in built:
        image, alias = _from_image(stage[0].arguments)
        if image not in aliases and image != "scratch" and not DIGEST.search(image):
            problems.append(f"line {stage[0].line}: FROM {image} is not pinned by @sha256 digest")
        if alias:
            aliases.add(alias)
    for instruction in instructions:
        if instruction.keyword in ("ENV", "ARG"):
            for name, value in _assignments(instruction.keyword, instruction.arguments):
                if SECRET_NAME.search(name) and value:
                    problems.append(f"line {instruction.line}: {instruction.keyword} {name} gives a secret a value")
        if instruction.keyword in ("ENTRYPOINT", "CMD"):
            try:
                form = json.loads(instruction.arguments)
            except json.JSONDecodeError:
                form = None
            if not isinstance(form, list) or not all(isinstance(word, str) for word in form):
                problems.append(f"line {instruction.line}: {instruction.keyword} is not in exec (JSON) form")
    users = [instruction for instruction in built[-1] if instruction.keyword == "USER"]
    if not users:
        problems.append("the final stage sets no USER (it would run as root)")
    else:
        user = users[-1].arguments.split(":")[0]
        if not user.isdigit() or int(user) == 0:
            problems.append(f"line {users[-1].line}: USER {users[-1].arguments} is not a numeric non-root uid")
    return problems


def repository_dockerfile() -> str:
    return (REPO / "Dockerfile").read_text(encoding="utf-8")


# == the checker =================================================================================================
def test_the_parser_joins_continuations_and_drops_comments() -> None:
    text = (
        "# syntax=docker/dockerfile:1\nFROM a AS b\n\n"
        "RUN one \\\n  # a comment inside\n  && two \\\n  && three\n"
        "USER 1\n"
    )
    assert parse_dockerfile(text) == [
        Instruction("FROM", "a AS b", 2),
        Instruction("RUN", "one && two && three", 4),
        Instruction("USER", "1", 8),
    ]


def test_a_bad_dockerfile_is_rejected() -> None:
    bad = (
        "FROM python:3.12-slim AS build\n"
        "ARG PIP_INDEX_TOKEN=abc123\n"
        "FROM build\n"
        "ENV DATABASE_PASSWORD hunter2\n"
        "ENV API_KEY=\n"  # an empty value gives nothing away
        "ENTRYPOINT heteroflow\n"
        "CMD [server]\n"
    )
    assert dockerfile_problems(bad) == [
        "line 1: FROM python:3.12-slim is not pinned by @sha256 digest",
        "line 2: ARG PIP_INDEX_TOKEN gives a secret a value",
        "line 4: ENV DATABASE_PASSWORD gives a secret a value",
        "line 6: ENTRYPOINT is not in exec (JSON) form",
        "line 7: CMD is not in exec (JSON) form",
        "the final stage sets no USER (it would run as root)",
    ]


@pytest.mark.parametrize("user", ["root", "0", "0:0", "heteroflow"])
def test_a_root_or_named_final_user_is_rejected(user: str) -> None:
    pinned = "FROM python:3.12-slim@sha256:" + "0" * 64
    assert dockerfile_problems(f"{pinned}\nUSER {user}\n") == [f"line 2: USER {user} is not a numeric non-root uid"]
    assert dockerfile_problems(f"{pinned}\nUSER {user}\nFROM {pinned.removeprefix('FROM ')}\nUSER 10001\n") == []


# == the repository's Dockerfile =================================================================================
def test_the_dockerfile_passes_the_checker() -> None:
    assert dockerfile_problems(repository_dockerfile()) == []


def test_the_image_is_python_3_11_or_newer_slim_and_built_from_the_source_tree() -> None:
    instructions = parse_dockerfile(repository_dockerfile())
    built = stages(instructions)
    assert len(built) >= 2, "multi-stage: the build tools stay out of the runtime image"
    for stage in built:
        image, _ = _from_image(stage[0].arguments)
        assert re.match(r"python:3\.(1[1-9])-slim", image), image
    runs = " ".join(i.arguments for i in instructions if i.keyword == "RUN")
    assert re.search(r"pip install \.(\s|$)", runs)
    final = built[-1]
    assert [i.arguments for i in final if i.keyword == "ENTRYPOINT"] == ['["heteroflow"]']
    assert any(i.keyword == "COPY" and i.arguments.startswith("--from=") for i in final)


def test_the_build_context_holds_only_what_the_build_needs() -> None:
    rules = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert rules[0] == "*", "exclude everything, then re-include"
    assert {rule.removeprefix("!").rstrip("/") for rule in rules if rule.startswith("!")} == {
        "pyproject.toml",
        "README.md",
        "src",
    }
    copied = [i.arguments for i in parse_dockerfile(repository_dockerfile()) if i.keyword == "COPY"]
    assert "pyproject.toml README.md ./" in copied
    assert "src ./src" in copied
