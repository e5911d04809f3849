"""JSON bytes ⇄ :class:`PersistedRuntime`, the only format either store writes. Purely computational.

The format carries ``"schema": 1``. Decoding trusts nothing: the bytes were written by another process,
possibly another version of it, or by hand. Anything that is not exactly a schema-1 record — bad UTF-8 or JSON,
an unknown or missing key, a wrong type (``true`` is not a rank, ``1.0`` is not a generation), an unknown
phase or fallback, a negative or repeated rank, ``dead_committed`` or a pending set outside
``original_dp_ranks`` — raises :class:`StoreCorruptError` with the reason. A restarted controller acts on
this record (F-32: it may relaunch engines or keep ranks retired), so a guess would be worse than a refusal.

Example (sorted keys, no spaces)::

    {"dead_committed":[1],"fallback":"EngineRelaunch","generation":7,"instance_id":"decode-0",
     "original_dp_ranks":[0,1,2,3],"phase":"SCALING_DOWN","schema":1,
     "write_ahead":{"pending_removed":[2],"phase":"SCALING_DOWN","request_id":"r-42"}}
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from heteroflow.serving.controller.core.phase import FtPhase
from heteroflow.serving.controller.core.ranks import DpRank, InstanceId, RequestId
from heteroflow.serving.controller.core.runtime import FallbackStrategy, PersistedRuntime, WriteAheadRecord

from .base import StoreCorruptError

SCHEMA_VERSION = 1

_RECORD_KEYS = frozenset(
    {"schema", "instance_id", "phase", "generation", "original_dp_ranks", "dead_committed", "fallback", "write_ahead"}
)
_WRITE_AHEAD_KEYS = frozenset({"request_id", "pending_removed", "phase"})


def encode_runtime(record: PersistedRuntime) -> bytes:
    """The stored form of ``record``.

    Raises :class:`ValueError` when the record would not decode (e.g. ``dead_committed`` outside the original
    ranks): a store must never write what it cannot read back after a restart.
    """
    write_ahead = record.write_ahead
    document: dict[str, object] = {
        "schema": SCHEMA_VERSION,
        "instance_id": record.instance_id,
        "phase": record.phase.value,
        "generation": record.generation,
        "original_dp_ranks": sorted(record.original_dp_ranks),
        "dead_committed": sorted(record.dead_committed),
        "fallback": record.fallback.value if record.fallback is not None else None,
        "write_ahead": None
        if write_ahead is None
        else {
            "request_id": write_ahead.request_id,
            "pending_removed": sorted(write_ahead.pending_removed),
            "phase": write_ahead.phase.value,
        },
    }
    data = json.dumps(document, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("utf-8")
    try:
        decoded = decode_runtime(data)
    except StoreCorruptError as exc:
        raise ValueError(f"refusing to store a runtime that would not load back: {exc.reason}") from exc
    if decoded != record:
        raise ValueError(f"refusing to store a runtime that would not load back unchanged: {record!r}")
    return data


def decode_runtime(data: bytes, *, instance_id: str | None = None) -> PersistedRuntime:
    """The record stored as ``data``; ``instance_id`` (the key it was stored under) must match the record's.

    Raises :class:`StoreCorruptError` naming the first problem found.
    """
    try:
        text = data.decode("utf-8")
        document = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise StoreCorruptError(f"not a JSON document: {exc}", instance_id=instance_id) from exc
    try:
        record = _record(document)
    except _Invalid as exc:
        raise StoreCorruptError(str(exc), instance_id=instance_id) from None
    if instance_id is not None and record.instance_id != instance_id:
        raise StoreCorruptError(
            f"stored under {instance_id!r} but the record is for {record.instance_id!r}", instance_id=instance_id
        )
    return record


class _Invalid(Exception):
    """A validation failure inside the decoder; turned into StoreCorruptError at its edge."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json keeps the last of repeated keys; a record with two "phase" keys has no single meaning.
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"key {key!r} repeated")
        result[key] = value
    return result


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not valid JSON")


def _record(document: object) -> PersistedRuntime:
    if isinstance(document, dict):
        # The version first: another schema may have other keys, and "lacks 'phase'" would hide the real cause.
        schema = document.get("schema")
        if type(schema) is not int or schema != SCHEMA_VERSION:
            raise _Invalid(f"'schema' is {schema!r}; this code reads schema {SCHEMA_VERSION} only")
    fields = _object(document, "record", _RECORD_KEYS)
    original = _ranks(fields["original_dp_ranks"], "original_dp_ranks")
    if not original:
        raise _Invalid("'original_dp_ranks' is empty; an instance has at least one DP rank")
    dead = _ranks(fields["dead_committed"], "dead_committed")
    if not dead <= original:
        raise _Invalid(f"'dead_committed' ranks {sorted(dead - original)} are not in 'original_dp_ranks'")
    generation = fields["generation"]
    if type(generation) is not int or generation < 0:
        raise _Invalid(f"'generation' must be a non-negative integer, not {generation!r}")
    fallback = fields["fallback"]
    return PersistedRuntime(
        instance_id=InstanceId(_text(fields["instance_id"], "instance_id")),
        phase=_phase(fields["phase"], "phase"),
        generation=generation,
        original_dp_ranks=original,
        dead_committed=dead,
        fallback=None if fallback is None else _fallback(fallback),
        write_ahead=_write_ahead(fields["write_ahead"], original),
    )


def _write_ahead(value: object, original: frozenset[DpRank]) -> WriteAheadRecord | None:
    if value is None:
        return None
    fields = _object(value, "'write_ahead'", _WRITE_AHEAD_KEYS)
    pending = _ranks(fields["pending_removed"], "write_ahead.pending_removed")
    if not pending <= original:
        raise _Invalid(f"'write_ahead.pending_removed' ranks {sorted(pending - original)} are not original ranks")
    return WriteAheadRecord(
        request_id=RequestId(_text(fields["request_id"], "write_ahead.request_id")),
        pending_removed=pending,
        phase=_phase(fields["phase"], "write_ahead.phase"),
    )


def _object(value: object, what: str, keys: frozenset[str]) -> dict[str, object]:
    if not isinstance(value, dict):
        raise _Invalid(f"{what} must be a JSON object, not {type(value).__name__}")
    missing = keys - value.keys()
    unknown = value.keys() - keys
    if missing:
        raise _Invalid(f"{what} lacks {_names(missing)}")
    if unknown:
        raise _Invalid(f"{what} has unknown {_names(unknown)}")
    return value


def _names(keys: Iterable[str]) -> str:
    return ", ".join(repr(key) for key in sorted(keys))


def _text(value: object, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise _Invalid(f"'{name}' must be a non-empty string, not {value!r}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate (legal in JSON's \u escapes) cannot be a key in either store.
        raise _Invalid(f"'{name}' is not valid Unicode text") from None
    return value


def _ranks(value: object, name: str) -> frozenset[DpRank]:
    if not isinstance(value, list):
        raise _Invalid(f"'{name}' must be a list of DP ranks, not {type(value).__name__}")
    seen: set[DpRank] = set()
    for item in value:
        # bool is an int subclass in Python; JSON true is never a rank.
        if type(item) is not int:
            raise _Invalid(f"'{name}' holds {item!r}, which is not an integer rank")
        if item < 0:
            raise _Invalid(f"'{name}' holds the negative rank {item}")
        if item in seen:
            raise _Invalid(f"'{name}' repeats rank {item}")
        seen.add(DpRank(item))
    return frozenset(seen)


def _phase(value: object, name: str) -> FtPhase:
    if not isinstance(value, str):
        raise _Invalid(f"'{name}' must be a phase name, not {value!r}")
    try:
        return FtPhase(value)
    except ValueError:
        raise _Invalid(f"'{name}' is the unknown phase {value!r}") from None


def _fallback(value: object) -> FallbackStrategy:
    if not isinstance(value, str):
        raise _Invalid(f"'fallback' must be a fallback strategy name or null, not {value!r}")
    try:
        return FallbackStrategy(value)
    except ValueError:
        raise _Invalid(f"'fallback' is the unknown strategy {value!r}") from None
