"""FtRuntimeStore: where the controller persists each instance's runtime (``serving-ft.md`` F-32, F-50).

- :mod:`.base` — the :class:`FtRuntimeStore` protocol, :class:`StoredRuntime`, :class:`LoadResult`, the errors.
- :mod:`.codec` — the JSON format (schema 1) and its strict decoder.
- :mod:`.sqlite` — :class:`SqliteFtRuntimeStore`, the embedded default (one file).
- :mod:`.etcd` — :class:`EtcdFtRuntimeStore`, production (etcd v3).
- :mod:`.testing` — :class:`~.testing.EtcdServer`, a real etcd for tests.

``docs/ft-runtime-store.md`` describes the layout, the compare-and-swap rules and outage behaviour.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from .base import (
    FtRuntimeStore,
    FtStoreError,
    LoadResult,
    NotLeaderError,
    StoreConflictError,
    StoreCorruptError,
    StoredRuntime,
)
from .codec import SCHEMA_VERSION, decode_runtime, encode_runtime
from .etcd import DEFAULT_PREFIX, EtcdFtRuntimeStore
from .sqlite import SqliteFtRuntimeStore

__all__ = [
    "DEFAULT_PREFIX",
    "SCHEMA_VERSION",
    "EtcdFtRuntimeStore",
    "FtRuntimeStore",
    "FtStoreError",
    "LoadResult",
    "NotLeaderError",
    "SqliteFtRuntimeStore",
    "StoreConflictError",
    "StoreCorruptError",
    "StoredRuntime",
    "decode_runtime",
    "encode_runtime",
    "open_store",
]

_URL_FORMS = "sqlite:///PATH or etcd://HOST:PORT[,HOST:PORT…][?prefix=/PREFIX/]"


def open_store(url: str, *, timeout_sec: float) -> FtRuntimeStore:
    """The store a URL names; nothing is contacted until the first call.

    - ``sqlite:///PATH`` — :class:`SqliteFtRuntimeStore` on PATH, as in SQLAlchemy URLs: ``sqlite:///ft.db`` is
      relative to the working directory, ``sqlite:////var/lib/heteroflow/ft.db`` absolute; ``~`` is expanded.
    - ``etcd://HOST:PORT[,HOST:PORT…][?prefix=/PREFIX/]`` — :class:`EtcdFtRuntimeStore` (prefix defaults to
      :data:`DEFAULT_PREFIX`).

    Anything else raises :class:`ValueError` saying which forms are accepted.
    """
    if url.startswith("sqlite:"):
        return SqliteFtRuntimeStore(_sqlite_path(url), timeout_sec=timeout_sec)
    if url.startswith("etcd:"):
        endpoints, prefix = _etcd_target(url)
        return EtcdFtRuntimeStore(endpoints, prefix=prefix, timeout_sec=timeout_sec)
    raise ValueError(f"unsupported FT runtime store URL {url!r}: use {_URL_FORMS}")


def _sqlite_path(url: str) -> Path:
    if not url.startswith("sqlite:///"):
        raise ValueError(f"SQLite store URL {url!r} must be sqlite:///PATH (three slashes, then the path)")
    path = url.removeprefix("sqlite:///")
    if not path or path == ":memory:" or "?" in path or "#" in path:
        # An in-memory database would forget dead_committed on restart: the one thing this store is for.
        raise ValueError(f"SQLite store URL {url!r} must name a file: sqlite:///PATH, without query or fragment")
    return Path(path).expanduser()


def _etcd_target(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    if parts.scheme != "etcd" or not parts.netloc:
        raise ValueError(f"etcd store URL {url!r} must be etcd://HOST:PORT[,HOST:PORT…][?prefix=/PREFIX/]")
    if "@" in parts.netloc:
        raise ValueError(f"etcd store URL {url!r}: credentials in the URL are not supported")
    if parts.path not in ("", "/") or parts.fragment:
        raise ValueError(f"etcd store URL {url!r}: the key prefix goes in ?prefix=…, not in the path")
    try:
        query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError as exc:
        raise ValueError(f"etcd store URL {url!r}: bad query: {exc}") from None
    unknown = set(query) - {"prefix"}
    if unknown:
        raise ValueError(f"etcd store URL {url!r}: unknown parameters {sorted(unknown)} (only 'prefix')")
    prefixes = query.get("prefix", [DEFAULT_PREFIX])
    if len(prefixes) != 1:
        raise ValueError(f"etcd store URL {url!r}: 'prefix' given {len(prefixes)} times")
    return parts.netloc, prefixes[0]
