"""Fakes for tests of the monitor: an in-memory :class:`~.kube.KubeApi`.

The fake is our own seam (the tests never patch the Kubernetes client): it holds objects per kind, serves
lists with a resourceVersion, and hands out watch events that the test pushes, one queue per kind. A test can
also make the next list fail, or end a watch with 410 Gone, to exercise the reconnect paths.
"""

from __future__ import annotations

import copy
import queue
import threading
from collections.abc import Iterator
from typing import Any

from .kube import Kind, WatchGoneError

_GONE = object()
_END = object()


class FakeKubeApi:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._objects: dict[Kind, dict[str, dict[str, Any]]] = {"configmaps": {}, "nodes": {}}
        self._queues: dict[Kind, queue.Queue[object]] = {"configmaps": queue.Queue(), "nodes": queue.Queue()}
        self._version = 0
        self.list_failures = 0
        """The next this-many ``list`` calls raise ``ConnectionError`` (an unreachable API server)."""
        self.lists: dict[Kind, int] = {"configmaps": 0, "nodes": 0}
        self.watches: dict[Kind, int] = {"configmaps": 0, "nodes": 0}

    # -- what the source calls (from its threads) ------------------------------------------------------------
    def list(self, kind: Kind) -> tuple[list[dict[str, Any]], str]:
        with self._lock:
            if self.list_failures > 0:
                self.list_failures -= 1
                raise ConnectionError("fake API server unreachable")
            self.lists[kind] += 1
            return [copy.deepcopy(o) for o in self._objects[kind].values()], str(self._version)

    def watch(self, kind: Kind, resource_version: str, timeout_sec: int) -> Iterator[dict[str, Any]]:
        with self._lock:
            self.watches[kind] += 1
        while True:
            try:
                item = self._queues[kind].get(timeout=0.05)
            except queue.Empty:
                return  # the server closed the watch; the source watches again
            if item is _GONE:
                raise WatchGoneError("too old resource version")
            if item is _END:
                return
            assert isinstance(item, dict)
            yield item

    # -- what the test does ----------------------------------------------------------------------------------
    def put(self, kind: Kind, obj: dict[str, Any], *, event: str | None = None) -> None:
        """Create or replace an object; with ``event``, also push that watch event (``ADDED`` / ``MODIFIED``)."""
        with self._lock:
            self._version += 1
            stored = copy.deepcopy(obj)
            stored.setdefault("metadata", {})["resourceVersion"] = str(self._version)
            self._objects[kind][stored["metadata"]["name"]] = stored
        if event is not None:
            self._queues[kind].put({"type": event, "object": copy.deepcopy(stored)})

    def delete(self, kind: Kind, name: str, *, event: bool = True) -> None:
        """Delete an object; without ``event`` the deletion is only seen by the next list (missed while away)."""
        with self._lock:
            self._version += 1
            stored = self._objects[kind].pop(name)
        if event:
            self._queues[kind].put({"type": "DELETED", "object": stored})

    def expire_watch(self, kind: Kind) -> None:
        """The watch ends with 410 Gone: the source must list again."""
        self._queues[kind].put(_GONE)

    def push_raw(self, kind: Kind, event: dict[str, Any]) -> None:
        """Any watch event, as is (garbage included)."""
        self._queues[kind].put(event)
