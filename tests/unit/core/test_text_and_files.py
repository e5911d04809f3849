"""Text that may travel on, C-speed body checks, and files at rest owner-only whatever the umask."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from heteroflow.core.files import private_sqlite
from heteroflow.core.request_body import exceeds_depth, nesting_depth, text_problem
from heteroflow.core.text import printable
from heteroflow.core.text import text_problem as field_problem

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='ab[]{}"\\,:'),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(alphabet='[]{}"\\ab', max_size=3), inner, max_size=4)
    ),
    max_leaves=40,
)


@given(json_values, st.integers(min_value=0, max_value=12))
def test_the_byte_scan_agrees_with_the_parsed_depth(value: object, limit: int) -> None:
    raw = json.dumps(value).encode()
    assert exceeds_depth(raw, max_depth=limit) is (nesting_depth(value, limit=limit) > limit)


def test_a_megabyte_of_small_containers_is_judged_on_its_bytes() -> None:
    raw = b"[" + b",".join([b'[{"a": "[[[["}]'] * 60_000) + b"]"
    assert not exceeds_depth(raw)  # the brackets inside strings are text
    assert exceeds_depth(b"[" * 33 + raw + b"]" * 33)
    assert text_problem(raw) is None


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (b'{"a": NaN}', "NaN"),
        (b"[-Infinity]", "NaN"),
        (b'{"m": "\\ud800"}', "surrogate"),
        (b'{"m": "x\\uDC00"}', "surrogate"),
        (b'{"m": "\\ud83d\\ude00"}', None),  # a pair is one character
        (b'{"m": "\\\\ud800"}', None),  # an escaped backslash, then text
        (b'{"NaN": "Infinity"}', None),
    ],
)
def test_text_problems_of_a_body(raw: bytes, problem: str | None) -> None:
    found = text_problem(raw)
    assert (found is None) if problem is None else (found is not None and problem in found)


@pytest.mark.parametrize(
    ("value", "kind"),
    [("ok-name", None), ("a\x00b", "control"), ("GPU-\u202e1", "bidirectional"), ("\ud800", "surrogate")],
)
def test_field_text(value: str, kind: str | None) -> None:
    found = field_problem(value)
    assert (found is None) if kind is None else (found is not None and kind in found)
    shown = printable(value)
    assert field_problem(shown) is None
    shown.encode("utf-8")
    assert printable(shown) == shown


@pytest.fixture
def loose_umask() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_sqlite_database_and_its_side_files_are_owner_only(tmp_path: Path, loose_umask: None) -> None:
    database = private_sqlite(tmp_path / "data" / "platform.db")
    conn = sqlite3.connect(database)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t (x)")
    conn.execute("INSERT INTO t VALUES (1)")
    conn.commit()
    sides = [database.with_name(database.name + s) for s in ("-wal", "-shm")]
    assert all(side.exists() for side in sides)
    assert mode(database.parent) == 0o700
    assert [mode(p) for p in (database, *sides)] == [0o600] * 3
    conn.close()
    os.chmod(database, 0o644)  # left loose by an older version: tightened on the next start
    private_sqlite(database)
    assert mode(database) == 0o600
