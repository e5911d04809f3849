"""MindCluster over the Kubernetes API: a watch of the ``kube-system/mindx-dl-deviceinfo-*`` ConfigMaps and of
the Nodes, feeding :mod:`.mindcluster`'s parser.

Three layers, so that only the thinnest one needs a cluster:

- :class:`KubeApi` — list and watch raw JSON objects of one kind. :class:`KubernetesApi` is the real one (the
  official ``kubernetes`` client, in-cluster configuration or a kubeconfig); it does nothing but translate.
- :class:`WatchHandler` — purely computational: a relist or a watch event (the dicts the client's watch yields:
  ``{"type": ..., "object" or "raw_object": {...}}``) → snapshots and problems. A relist also clears the objects
  that disappeared while we were not watching.
- :class:`KubernetesSource` — the blocking list-then-watch loop of each kind in its own thread, reconnecting with
  back-off (a 410 Gone relists at once), handing raw objects to the event loop, where the handler runs. Parsing
  on the loop keeps ``hosts_instance`` (which reads the controller's state) on the controller's thread.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import structlog

from .base import Emit, Problem, Snapshot, SourceUpdate
from .mindcluster import DEFAULT_NAME_PREFIX, DEFAULT_NAMESPACE, HostsInstance, parse_configmap, parse_node

_log = structlog.get_logger(__name__)

Kind = Literal["configmaps", "nodes"]


class WatchGoneError(Exception):
    """The watch's resource version is too old (HTTP 410): list again, then watch from the new version."""


class KubeApi(Protocol):
    """The part of the Kubernetes API the source uses; blocking calls, made from the source's threads."""

    def list(self, kind: Kind) -> tuple[list[dict[str, Any]], str]:
        """Every object of ``kind`` (ConfigMaps: in the namespace) as raw dicts, and the list's resourceVersion."""
        ...

    def watch(self, kind: Kind, resource_version: str, timeout_sec: int) -> Iterator[dict[str, Any]]:
        """Watch events from ``resource_version`` on, as dicts with ``type`` and ``object`` (or ``raw_object``).
        Ends when the server closes the watch (``timeout_sec``); raises :class:`WatchGoneError` on 410."""
        ...


class KubernetesApi:
    """:class:`KubeApi` over the official client: in-cluster configuration, else the kubeconfig
    (``kubeconfig`` or the client's default ``~/.kube/config``)."""

    def __init__(self, *, namespace: str, kubeconfig: str | None = None) -> None:
        from kubernetes import client
        from kubernetes import config as kube_config

        config: Any = kube_config  # the client's loaders are untyped
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig)
        else:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
        self._namespace = namespace
        self._core: Any = client.CoreV1Api()

    def _lister(self, kind: Kind) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        if kind == "configmaps":
            return self._core.list_namespaced_config_map, (self._namespace,)
        return self._core.list_node, ()

    def list(self, kind: Kind) -> tuple[list[dict[str, Any]], str]:
        func, args = self._lister(kind)
        response = func(*args, _preload_content=False, _request_timeout=30)
        body = json.loads(response.data)
        return list(body.get("items") or []), str(body.get("metadata", {}).get("resourceVersion", ""))

    def watch(self, kind: Kind, resource_version: str, timeout_sec: int) -> Iterator[dict[str, Any]]:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        func, args = self._lister(kind)
        watch_module: Any = watch  # untyped
        stream: Any = watch_module.Watch()
        try:
            yield from stream.stream(
                func,
                *args,
                resource_version=resource_version,
                timeout_seconds=timeout_sec,
                _request_timeout=timeout_sec + 30,
            )  # events carry the raw dict as "raw_object" (deserialize=False breaks the client's 410 handling)
        except ApiException as exc:
            if exc.status == 410:
                raise WatchGoneError(str(exc.reason)) from exc
            raise


@dataclass
class WatchHandler:
    """Relists and watch events → snapshots and problems. Purely computational (``hosts_instance`` aside)."""

    source: str
    hosts_instance: HostsInstance
    name_prefix: str = DEFAULT_NAME_PREFIX
    _known: dict[Kind, set[str]] = field(default_factory=lambda: {"configmaps": set(), "nodes": set()})

    def relisted(self, kind: Kind, items: list[dict[str, Any]]) -> list[SourceUpdate]:
        """The full state after a (re)list: every object's snapshot, and a clear for each object that was known
        and is gone (deleted while the watch was down)."""
        updates: list[SourceUpdate] = []
        seen: set[str] = set()
        for item in items:
            name, parsed = self._parse(kind, item, updates)
            if name is not None:
                seen.add(name)
                if parsed is not None:
                    updates.append(parsed)
        for name in sorted(self._known[kind] - seen):
            updates.append(Snapshot(scope=self._scope(kind, name), faults=()))
        self._known[kind] = seen
        return updates

    def event(self, kind: Kind, event: object) -> list[SourceUpdate]:
        """One watch event: ADDED / MODIFIED → the object's snapshot, DELETED → a clear, BOOKMARK → nothing."""
        if not isinstance(event, dict):
            return [Problem(scope=kind, detail="a watch event that is not an object")]
        kind_of_event = event.get("type")
        obj = event.get("raw_object", event.get("object"))
        if kind_of_event == "BOOKMARK":
            return []
        if kind_of_event not in ("ADDED", "MODIFIED", "DELETED"):
            return [Problem(scope=kind, detail=f"unexpected watch event type {kind_of_event!r}")]
        updates: list[SourceUpdate] = []
        if kind_of_event == "DELETED":
            name = _name(obj)
            if name is None:
                return [Problem(scope=kind, detail="a DELETED event without metadata.name")]
            if kind == "configmaps" and not self._wanted(name):
                return []
            self._known[kind].discard(name)
            return [Snapshot(scope=self._scope(kind, name), faults=())]
        name, parsed = self._parse(kind, obj, updates)
        if name is not None:
            self._known[kind].add(name)
            if parsed is not None:
                updates.append(parsed)
        return updates

    def _wanted(self, name: str) -> bool:
        return name.startswith(self.name_prefix) and len(name) > len(self.name_prefix)

    def _scope(self, kind: Kind, name: str) -> str:
        return f"configmap/{name}" if kind == "configmaps" else f"node/{name}"

    def _parse(self, kind: Kind, obj: object, updates: list[SourceUpdate]) -> tuple[str | None, Snapshot | None]:
        name = _name(obj)
        if name is None:
            updates.append(Problem(scope=kind, detail="an object without metadata.name"))
            return None, None
        if kind == "configmaps" and not self._wanted(name):
            return None, None  # kube-system holds many other ConfigMaps
        scope = self._scope(kind, name)
        if kind == "configmaps":
            parsed = parse_configmap(
                obj, source=self.source, hosts_instance=self.hosts_instance, name_prefix=self.name_prefix
            )
        else:
            parsed = parse_node(obj, source=self.source)
        updates.extend(Problem(scope=scope, detail=problem) for problem in parsed.problems)
        return name, None if parsed.faults is None else Snapshot(scope=scope, faults=parsed.faults)


def _name(obj: object) -> str | None:
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return name if isinstance(name, str) and name else None


class KubernetesSource:
    """The MindCluster watch: ConfigMaps of ``namespace`` whose name starts with ``name_prefix``, and (with
    ``watch_nodes``) every Node. Each kind is listed, then watched from the list's version, in its own daemon
    thread; a failure is reported as a problem and retried after ``retry_sec`` (doubling up to
    ``max_retry_sec``), a 410 Gone relists at once."""

    def __init__(
        self,
        *,
        api_factory: Callable[[], KubeApi],
        hosts_instance: HostsInstance,
        namespace: str = DEFAULT_NAMESPACE,
        name_prefix: str = DEFAULT_NAME_PREFIX,
        watch_nodes: bool = True,
        watch_timeout_sec: int = 300,
        retry_sec: float = 1.0,
        max_retry_sec: float = 30.0,
        name: str = "mindcluster-kube",
    ) -> None:
        self.name = name
        self.namespace = namespace
        self._api_factory = api_factory
        self._hosts_instance = hosts_instance
        self._name_prefix = name_prefix
        self._kinds: tuple[Kind, ...] = ("configmaps", "nodes") if watch_nodes else ("configmaps",)
        self._watch_timeout = watch_timeout_sec
        self._retry = retry_sec
        self._max_retry = max_retry_sec
        self._handler = WatchHandler(source=name, hosts_instance=hosts_instance, name_prefix=name_prefix)
        """Kept across runs: a relist after a restart still clears what was deleted meanwhile."""

    async def run(self, emit: Emit) -> None:
        loop = asyncio.get_running_loop()
        handler = self._handler
        stop = threading.Event()

        def deliver(kind: Kind, message: tuple[str, Any]) -> None:  # on the loop
            what, payload = message
            if what == "relist":
                updates = handler.relisted(kind, payload)
            elif what == "event":
                updates = handler.event(kind, payload)
            else:
                updates = [Problem(scope=kind, detail=str(payload))]
            for update in updates:
                emit(update)

        def post(kind: Kind, message: tuple[str, Any]) -> bool:  # from a thread
            if stop.is_set():
                return False
            try:
                loop.call_soon_threadsafe(deliver, kind, message)
            except RuntimeError:  # the loop is closed: the controller is going away
                return False
            return True

        threads = [
            threading.Thread(target=self._pump, args=(kind, post, stop), name=f"kube-watch-{kind}", daemon=True)
            for kind in self._kinds
        ]
        for thread in threads:
            thread.start()
        try:
            await asyncio.Event().wait()  # until cancelled; the threads do the work
        finally:
            stop.set()

    def _pump(self, kind: Kind, post: Callable[[Kind, tuple[str, Any]], bool], stop: threading.Event) -> None:
        """List, then watch, forever; the only place that blocks on the API."""
        delay = self._retry
        api: KubeApi | None = None
        while not stop.is_set():
            try:
                if api is None:
                    api = self._api_factory()
                items, version = api.list(kind)
                if not post(kind, ("relist", items)):
                    return
                delay = self._retry
                while not stop.is_set():
                    for event in api.watch(kind, version, self._watch_timeout):
                        if stop.is_set() or not post(kind, ("event", event)):
                            return
                        version = _version(event) or version
            except WatchGoneError:
                continue  # relist at once: what we missed is in the new list
            except Exception as exc:
                _log.warning("monitor.kube_watch_failed", kind=kind, error=f"{type(exc).__name__}: {exc}"[:500])
                if not post(kind, ("problem", f"watch failed, retrying in {delay:g} s: {type(exc).__name__}: {exc}")):
                    return
                stop.wait(delay)
                delay = min(delay * 2, self._max_retry)


def _version(event: object) -> str | None:
    obj = event.get("raw_object", event.get("object")) if isinstance(event, dict) else None
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    version = metadata.get("resourceVersion") if isinstance(metadata, dict) else None
    return version if isinstance(version, str) and version else None


__all__ = [
    "KubeApi",
    "KubernetesApi",
    "KubernetesSource",
    "WatchGoneError",
    "WatchHandler",
]
