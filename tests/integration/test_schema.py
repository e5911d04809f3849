"""The migrations build exactly the schema the code declares, on both backends."""

from __future__ import annotations

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.engine import Engine

from heteroflow.health.counters import HEALTH_KEYS
from heteroflow.storage.schema import metadata


def test_migrations_match_the_declared_schema(engine: Engine) -> None:
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
    assert diff == []


def test_counter_columns_are_nullable_64_bit_without_default(engine: Engine) -> None:
    columns = {c["name"]: c for c in sa.inspect(engine).get_columns("gpu_health_samples")}
    for key in HEALTH_KEYS:
        column = columns[key]
        assert column["nullable"] is True
        assert column["default"] is None
        assert isinstance(column["type"], sa.BigInteger)
    indexes = {tuple(ix["column_names"]) for ix in sa.inspect(engine).get_indexes("gpu_health_samples")}
    assert ("node_id", "gpu_index", "sampled_at") in indexes
    assert ("source",) in indexes
    assert ("sampled_at",) in indexes
