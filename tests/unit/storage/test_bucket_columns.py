"""The capability buckets' counter columns: pinned in the migration that created them, derived in the schema."""

from __future__ import annotations

import importlib

from heteroflow.health.counters import HEALTH_KEYS
from heteroflow.storage import schema


def test_the_bucket_table_has_a_column_per_health_counter_and_its_migration_pins_the_same_list() -> None:
    migration = importlib.import_module("heteroflow.storage.migrations.versions.0008_card_buckets")
    columns = {column.name for column in schema.gpu_health_card_buckets.columns}

    assert set(HEALTH_KEYS) <= columns
    # a counter added to the domain needs a migration that adds its column: this fails until one does
    assert tuple(HEALTH_KEYS) == migration.COUNTERS
