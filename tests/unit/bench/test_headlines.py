"""The table of today's figures in ``docs/benchmarks.md``: every headline has a command that exists."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from bench.headlines import COLUMNS, END, REPO, START, TableError, problems, read_headlines, scripts_of

PAGE = REPO / "docs" / "benchmarks.md"
HEADER = "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS) + "\n"
ROW = (
    "| CPU | 1.8 floors | at most 2 | met | `.venv/bin/python bench/ingest.py --nodes 1000` | `674ba52` "
    "| 2026-12-07 | dev | 0.7 |\n"
)


def _page(*rows: str) -> str:
    return f"# Benchmarks\n\n{START}\n{HEADER}{''.join(rows)}{END}\n\n## History\n"


def test_the_page_opens_with_its_headlines_and_every_one_has_a_command_that_exists() -> None:
    text = PAGE.read_text()
    headlines = read_headlines(text)
    assert len(headlines) >= 10
    assert problems(headlines, repo=REPO) == []
    assert text.index(START) < text.index("## History")  # the first screen, before any history


def test_the_script_passes_on_the_page() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "headlines.py")], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "headlines, each with a command that exists" in done.stdout


def test_a_headline_whose_script_is_gone_fails(tmp_path: Path) -> None:
    page = tmp_path / "benchmarks.md"
    page.write_text(_page(ROW, ROW.replace("bench/ingest.py", "bench/ingest_old.py")))
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "headlines.py"), "--file", str(page)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines() == ["error: line 7 (CPU): bench/ingest_old.py does not exist"]


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        (ROW.replace("`.venv/bin/python bench/ingest.py --nodes 1000`", "see above"), "names no script"),
        (ROW.replace("`.venv/bin/python bench/ingest.py --nodes 1000`", ""), "empty or missing cells: command"),
        (ROW.replace("| 0.7 |", "|  |"), "empty or missing cells: load average"),
        (ROW.replace("| met |", "| fine |"), "met? is 'fine'"),
        (ROW.replace("`674ba52`", "yesterday's"), "neither a commit"),
    ],
    ids=["no script", "no command", "no load", "no verdict", "no tree"],
)
def test_a_row_without_what_it_needs_fails(row: str, problem: str) -> None:
    found = problems(read_headlines(_page(row)), repo=REPO)
    assert len(found) == 1
    assert problem in found[0]


def test_no_table_or_another_table_is_refused() -> None:
    with pytest.raises(TableError, match="no <!-- headlines"):
        read_headlines("# Benchmarks\n")
    with pytest.raises(TableError, match="header"):
        read_headlines(f"{START}\n| a | b |\n|---|---|\n{END}\n")
    assert problems(read_headlines(_page()), repo=REPO) == ["the table has no headline"]


def test_scripts_of_a_command() -> None:
    assert scripts_of("`VLLM_TIER_FIGURES=/tmp/f.jsonl scripts/test tests/vllm -q -ra`") == [
        "scripts/test",
        "tests/vllm",
    ]
    assert scripts_of("`PYTHONPATH=src:bench .venv/bin/python bench/gpu_health_api.py --cards 1000`") == [
        "bench/gpu_health_api.py"
    ]
    assert scripts_of("bench/ingest.py outside backticks") == []


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, each space a hyphen."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_links_within_the_page_resolve() -> None:
    text = PAGE.read_text()
    anchors = {_slug(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}
    linked = set(re.findall(r"\]\(#([^)]+)\)", text))  # the table's, the superseded notes' and the history's own
    assert linked - anchors == set()
