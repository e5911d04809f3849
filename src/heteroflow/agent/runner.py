"""The agent's main loop: register, beat, reconnect with backoff, re-register when the node is gone.

The loop only reads caches (collection runs in :mod:`heteroflow.agent.scheduler`), sends, and applies the
answer. Its state is visible as a frozen :class:`AgentStatus`; tests assert on that, not on logs.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import structlog

from heteroflow.agent.backoff import retry_delay
from heteroflow.agent.client import (
    CredentialRequiredError,
    NodeGoneError,
    PermanentError,
    PlatformClient,
    Registration,
    ServerUnavailableError,
)
from heteroflow.agent.heartbeat import MAX_XID_EVENTS_PER_BEAT, heartbeat_body
from heteroflow.agent.kernel_xid import KernelXidReader
from heteroflow.agent.nvml import XidWatcher
from heteroflow.agent.readings import HealthCollection, TelemetryCollection
from heteroflow.agent.scheduler import CollectionService, CollectionStatus
from heteroflow.agent.xid_merge import XidMerger
from heteroflow.agent.xid_queue import XidQueue, XidQueueStatus
from heteroflow.agent.xid_status import XID_NEEDS_NVML, XidCollectionStatus, not_collected, with_kernel_log
from heteroflow.core.clock import Clock
from heteroflow.core.ids import NodeId, Source

_log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class AgentStatus:
    node_id: NodeId | None
    registrations: int
    beats_sent: int
    beats_failed: int
    consecutive_failures: int
    last_beat_at: datetime | None
    last_error: str | None
    stopped_reason: str | None
    xid: XidQueueStatus
    collection: CollectionStatus
    xid_collection: XidCollectionStatus


def registration_for(
    *, hostname: str, source: Source, health: HealthCollection | None, telemetry: TelemetryCollection | None
) -> Registration:
    """What the node registers as, from what the collector sees. Pure.

    ``model`` is the most common card name (nodes are normally uniform); a node where nothing is
    collected registers with vendor ``unknown`` and zero cards rather than not at all, so it still shows up
    as alive.
    """
    vendors = [gpu.vendor for gpu in (health.gpus if health else ())]
    names = [gpu.name for gpu in (health.gpus if health else ()) if gpu.name]
    names += [gpu.name for gpu in (telemetry.gpus if telemetry else ()) if gpu.name and not health]
    indexes = {gpu.index for gpu in (health.gpus if health else ())} | {
        gpu.index for gpu in (telemetry.gpus if telemetry else ())
    }
    vendor = collections.Counter(vendors).most_common(1)[0][0] if vendors else "unknown"
    model = collections.Counter(names).most_common(1)[0][0] if names else ""
    return Registration(hostname=hostname, vendor=vendor, model=model[:200], gpu_count=len(indexes), source=source)


class Agent:
    def __init__(
        self,
        *,
        client: PlatformClient,
        collection: CollectionService,
        xid_queue: XidQueue,
        clock: Clock,
        hostname: str,
        source: Source,
        heartbeat_interval_sec: float,
        reconnect_initial_sec: float,
        reconnect_max_sec: float,
        stop: threading.Event | None = None,
        xid_watcher: XidWatcher | None = None,
        xid_unwatched: XidCollectionStatus | None = None,
        kernel_xids: KernelXidReader | None = None,
    ) -> None:
        self._client = client
        self._collection = collection
        self._xids = xid_queue
        self._clock = clock
        self._hostname = hostname
        self._source: Source = source
        self._interval_s = heartbeat_interval_sec
        self._backoff = (reconnect_initial_sec, reconnect_max_sec)
        self.stop_event = stop or threading.Event()
        self._xid_watcher = xid_watcher
        self._xid_unwatched = xid_unwatched or not_collected(XID_NEEDS_NVML)
        self._kernel_xids = kernel_xids
        self._merger = XidMerger(sink=xid_queue.put, monotonic=clock.monotonic)
        self._lock = threading.Lock()
        self._node_id: NodeId | None = None
        self._registrations = 0
        self._sent = 0
        self._failed = 0
        self._consecutive = 0
        self._last_beat_at: datetime | None = None
        self._last_error: str | None = None
        self._stopped_reason: str | None = None

    def status(self) -> AgentStatus:
        with self._lock:
            return AgentStatus(
                node_id=self._node_id,
                registrations=self._registrations,
                beats_sent=self._sent,
                beats_failed=self._failed,
                consecutive_failures=self._consecutive,
                last_beat_at=self._last_beat_at,
                last_error=self._last_error,
                stopped_reason=self._stopped_reason,
                xid=self._xids.status(),
                collection=self._collection.status(),
                xid_collection=self.xid_collection(),
            )

    def register(self) -> NodeId:
        """Register (again); the same hostname gets the same node id. Raises :class:`PlatformError`."""
        health, telemetry = self._collection.snapshot()
        registration = registration_for(
            hostname=self._hostname, source=self._source, health=health, telemetry=telemetry
        )
        registered = self._client.register(registration)
        with self._lock:
            self._node_id = registered.node_id
            self._registrations += 1
        _log.info(
            "agent.registered",
            node_id=registered.node_id,
            created=registered.created,
            hostname=self._hostname,
            source=self._source,
            gpu_count=registration.gpu_count,
        )
        return registered.node_id

    def beat(self) -> None:
        """One heartbeat from the caches, with the oldest waiting XID events. Raises PlatformError."""
        node_id = self._node_id if self._node_id is not None else self.register()
        health, telemetry = self._collection.snapshot()
        pending = self._xids.peek(MAX_XID_EVENTS_PER_BEAT)
        body = heartbeat_body(
            health=health,
            telemetry=telemetry,
            xid_events=pending,
            xid_collection=self.xid_collection(),
            tool_stalls=self._collection.stalls.stalls(),
        )
        try:
            result = self._client.heartbeat(node_id, body)
        except NodeGoneError:
            with self._lock:
                self._node_id = None
            raise
        if pending and not result.xid_retry:
            # Stored, already stored before, or rejected as unusable: none of them is sent again.
            self._xids.ack(pending)
            if result.xid_rejected:
                _log.warning("agent.xid_rejected", reasons=list(result.xid_rejected)[:10])
        with self._lock:
            self._sent += 1
            self._consecutive = 0
            self._last_error = None
            self._last_beat_at = self._clock.now()

    def _record_failure(self, exc: ServerUnavailableError | CredentialRequiredError) -> float:
        with self._lock:
            self._failed += 1
            self._consecutive += 1
            self._last_error = f"{type(exc).__name__}: {exc}"
            failures = self._consecutive
        if isinstance(exc, CredentialRequiredError):
            # the server says when to ask again: come back then, not sooner, not later (else back off)
            delay = (
                min(exc.retry_after_sec, self._backoff[1])
                if exc.retry_after_sec is not None
                else retry_delay(failures, retry_after_sec=None, initial_sec=self._backoff[0], max_sec=self._backoff[1])
            )
            _log.error(
                "agent.node_credential_missing",
                hostname=self._hostname,
                detail=str(exc),
                retry_in_sec=delay,
                hint="this agent has no stored credential for its registered node (its state folder was lost); "
                "it retries until an operator releases the node's credential: "
                "POST /api/v1/nodes/<node id>/release",
            )
            return delay
        delay = retry_delay(
            failures, retry_after_sec=exc.retry_after_sec, initial_sec=self._backoff[0], max_sec=self._backoff[1]
        )
        _log.warning("agent.server_unreachable", error=self._last_error, retry_in_sec=delay)
        return delay

    def xid_collection(self) -> XidCollectionStatus:
        """Whether XID events are collected here, and why not (sent with every beat, shown by the status)."""
        base = self._xid_unwatched if self._xid_watcher is None else self._xid_watcher.status()
        if self._kernel_xids is None:
            return base
        kernel = self._kernel_xids.status()
        return with_kernel_log(
            base,
            readable=kernel.readable,
            reason=kernel.reason,
            cards=kernel.cards,
            nvml=self._xid_watcher is not None,
            lost=kernel.lost,
        )

    @property
    def xid_duplicates(self) -> int:
        """XID reports dropped because the other source had already reported the same XID."""
        return self._merger.duplicates

    def _kernel_loop(self, reader: KernelXidReader) -> None:
        while not self.stop_event.is_set():
            events = reader.poll()
            for event in events:
                _log.warning("agent.xid", gpu_index=event.index, xid=event.xid, source="kernel_log")
                self._merger.offer("kernel_log", event)
            self._merger.flush()
            if not reader.status().readable:
                _log.warning("agent.xid_kernel_log", reason=reader.status().reason)
                self._merger.hold_nvml_events(False)
                return
            if not events and self.stop_event.wait(0.5):
                return

    def _xid_loop(self, watcher: XidWatcher) -> None:
        reported: XidCollectionStatus | None = None
        while not self.stop_event.is_set():
            event = watcher.poll(500)
            self._merger.flush()
            if event is not None:
                _log.warning("agent.xid", gpu_index=event.index, xid=event.xid, source="nvml")
                self._merger.offer("nvml", event)
                continue
            state = watcher.status()
            if reported is None or (state.state, state.reason) != (reported.state, reported.reason):
                if state.state != "collected" or reported is not None:
                    _log.warning("agent.xid_collection", state=state.state, reason=state.reason)
                reported = state
            delay = watcher.retry_delay_sec()
            if delay > 0 and self.stop_event.wait(delay):
                break  # a failing wait is backed off, never retried at once

    def run(self) -> int:
        """Beat until :attr:`stop_event` is set. Returns the process exit code (0 clean, 2 refused)."""
        self._collection.start()
        xid_thread: threading.Thread | None = None
        if self._xid_watcher is not None and self._xid_watcher.start():
            xid_thread = threading.Thread(
                target=self._xid_loop, args=(self._xid_watcher,), name="heteroflow-xid", daemon=True
            )
            xid_thread.start()
        kernel_thread: threading.Thread | None = None
        if self._kernel_xids is not None:
            if self._kernel_xids.start():
                self._merger.hold_nvml_events(True)
                kernel_thread = threading.Thread(
                    target=self._kernel_loop, args=(self._kernel_xids,), name="heteroflow-kmsg", daemon=True
                )
                kernel_thread.start()
            else:
                _log.warning("agent.xid_kernel_log", reason=self._kernel_xids.status().reason)
        code = 0
        try:
            self._wait_for_first_collection()
            while not self.stop_event.is_set():
                try:
                    self.beat()
                    wait = self._interval_s
                except NodeGoneError as exc:
                    _log.warning("agent.node_gone", error=str(exc))
                    wait = 0.0
                except PermanentError as exc:
                    with self._lock:
                        self._last_error = f"{type(exc).__name__}: {exc}"
                        self._stopped_reason = str(exc)
                    _log.error("agent.refused", error=str(exc))
                    code = 2
                    break
                except (ServerUnavailableError, CredentialRequiredError) as exc:
                    wait = self._record_failure(exc)  # a lost credential waits for its node, never exits
                if self.stop_event.wait(wait):
                    break
        finally:
            self.stop_event.set()
            if xid_thread is not None:
                xid_thread.join(2.0)
            if kernel_thread is not None:
                kernel_thread.join(2.0)
            if self._kernel_xids is not None:
                self._kernel_xids.close()
            self._merger.flush(force=True)
            if self._xid_watcher is not None:
                self._xid_watcher.close()
            self._collection.stop()
            self._client.close()
            with self._lock:
                self._stopped_reason = self._stopped_reason or "stopped"
        return code

    def _wait_for_first_collection(self) -> None:
        """Register with the cards known: wait (bounded by one tick timeout) for the first telemetry."""
        poll_sec = 0.05
        for _ in range(int(self._interval_s / poll_sec) + 1):
            _, telemetry = self._collection.snapshot()
            if telemetry is not None or self.stop_event.wait(poll_sec):
                return


def install_stop_signals(stop: Callable[[], None]) -> None:
    """SIGTERM and SIGINT stop the agent cleanly (the loop finishes its beat, then closes everything)."""
    import signal

    def handler(signum: int, frame: object) -> None:
        stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
