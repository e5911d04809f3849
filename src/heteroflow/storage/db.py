"""Engines, connection settings and schema migrations."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy.engine import Connection, Engine

from heteroflow.core.errors import StoreUnavailableError
from heteroflow.core.files import private_sqlite

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
_PG_MIGRATION_LOCK = 0x6865_7465  # advisory lock id: one server migrates at a time


class DatabaseUrlError(ValueError):
    """A database URL HeteroFlow cannot use."""


@contextmanager
def unavailable_as_store_error() -> Iterator[None]:
    """Translate "the database cannot be reached" into :class:`StoreUnavailableError` (retry later)."""
    try:
        yield
    except (sa.exc.OperationalError, sa.exc.InterfaceError, sa.exc.TimeoutError) as exc:
        origin = getattr(exc, "orig", None) or exc
        lines = str(origin).strip().splitlines()
        raise StoreUnavailableError(f"{type(origin).__name__}: {lines[0] if lines else ''}") from exc


def normalise_url(url: str) -> sa.URL:
    """Accept ``sqlite:///path`` and ``postgresql://…`` (psycopg 3 is the driver for the latter)."""
    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError as exc:
        raise DatabaseUrlError(f"not a database URL: {url!r}") from exc
    backend = parsed.get_backend_name()
    if backend == "postgresql":
        return parsed.set(drivername="postgresql+psycopg")
    if backend == "sqlite":
        return parsed.set(drivername="sqlite")
    raise DatabaseUrlError(f"unsupported database {backend!r}: use sqlite:///PATH or postgresql://…")


def create_db_engine(url: str, *, connect_timeout_sec: int = 5) -> Engine:
    """An engine tuned for the backend: WAL + foreign keys on SQLite, a connect timeout on PostgreSQL."""
    parsed = normalise_url(url)
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database
        if database and database != ":memory:" and not database.startswith("file:"):
            private_sqlite(Path(database).expanduser())  # 0600 in a 0700 folder, side files included
        engine = sa.create_engine(
            parsed,
            connect_args={"check_same_thread": False, "timeout": 30},
            pool_size=8,
            max_overflow=8,
        )
        sa.event.listen(engine, "connect", _sqlite_on_connect)
        return engine
    return sa.create_engine(
        parsed,
        pool_pre_ping=True,
        pool_size=10,
        max_overflow=10,
        pool_timeout=connect_timeout_sec,
        connect_args={"connect_timeout": connect_timeout_sec},
    )


def _json_default(value: object) -> str:
    # the encoder calls this only for what JSON has no type for: the datetimes, stored naive UTC (UtcDateTime)
    if not isinstance(value, datetime):
        raise TypeError(f"{type(value).__name__} is not a column value")
    if value.tzinfo is None:
        raise ValueError("naive datetime given to a UTC column")
    # isoformat, not strftime: "%Y" writes year 1 as "1", which PostgreSQL would read as 2001
    return value.astimezone(UTC).replace(tzinfo=None).isoformat(sep=" ")


def json_rows(rows: Sequence[Mapping[str, Any]]) -> str:
    """``rows`` as one JSON array for PostgreSQL's ``json_populate_record`` (datetimes as the naive UTC text the
    ``UtcDateTime`` columns store; an aware value is required, as there). The C encoder converts every other
    value: no Python call per value."""
    return json.dumps(list(rows), default=_json_default)


def insert_rows(conn: Connection, table: sa.Table, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert ``rows`` (each with the same keys, column names of ``table``) in ``conn``'s transaction, ids in
    the rows' order.

    On PostgreSQL the rows travel as one JSON parameter (``json_populate_record`` into the table's own row
    type): an ``INSERT`` bound one value at a time costs psycopg more CPU converting the parameters than
    PostgreSQL spends on the statement, and the health writer and the minute flush run in worker threads whose
    Python work holds the interpreter while the event loop waits. Elsewhere: one ``executemany`` ``INSERT``.
    """
    if not rows:
        return
    if conn.dialect.name != "postgresql":
        conn.execute(sa.insert(table), list(rows))
        return
    conn.execute(_json_insert(table, tuple(rows[0])), {"rows": json_rows(rows)})


@functools.lru_cache(maxsize=16)
def _json_insert(table: sa.Table, names: tuple[str, ...]) -> sa.TextClause:
    # the schema's names are plain lower-case identifiers, and none comes from input
    columns = ", ".join(names)
    picked = ", ".join(f"b.{name}" for name in names)
    return sa.text(
        f"INSERT INTO {table.name} ({columns}) SELECT {picked} "  # noqa: S608
        "FROM json_array_elements(CAST(:rows AS json)) WITH ORDINALITY AS e(value, ord), "
        f"json_populate_record(NULL::{table.name}, e.value) AS b ORDER BY e.ord"
    )


def _sqlite_on_connect(dbapi_connection: Any, _: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def alembic_config(engine: Engine) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["engine"] = engine
    return config


def upgrade_database(engine: Engine) -> None:
    """Bring the schema to the newest migration (servers run this at start; concurrent starts serialise)."""
    config = alembic_config(engine)
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT pg_advisory_lock(:id)"), {"id": _PG_MIGRATION_LOCK})
            try:
                config.attributes["connection"] = conn
                command.upgrade(config, "head")
                conn.commit()
            finally:
                conn.execute(sa.text("SELECT pg_advisory_unlock(:id)"), {"id": _PG_MIGRATION_LOCK})
                conn.commit()
        return
    with engine.connect() as conn:
        # SQLite recreates a table to change its constraints; with foreign keys on, dropping the old copy would
        # cascade into every table that references it. The pragma is ignored inside a transaction: set it first.
        conn.exec_driver_sql("PRAGMA foreign_keys=OFF")
        conn.commit()
        try:
            with conn.begin():
                config.attributes["connection"] = conn
                command.upgrade(config, "head")
                violations = conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
                if violations:
                    raise RuntimeError(f"the migration left rows without their parent: {violations[:5]}")
        finally:
            conn.exec_driver_sql("PRAGMA foreign_keys=ON")
            conn.commit()


def utc_value(value: Any) -> datetime:
    """A timestamp read through a subquery, where the column type (and its conversion) may be lost."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    assert isinstance(value, datetime)
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
