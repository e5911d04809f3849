"""Everything a request handler needs, built once at start-up and passed down (no singletons)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from sqlalchemy.engine import Engine

from heteroflow.core.admission import AdmissionGate
from heteroflow.core.auth_failures import FailedCredentials
from heteroflow.core.client_limits import InFlightByKey
from heteroflow.core.clock import Clock
from heteroflow.core.ids import NodeId
from heteroflow.core.ttl_cache import TtlCache
from heteroflow.health.ingest import HealthIngestor
from heteroflow.health.metrics_settings import GpuMetricsSettings
from heteroflow.health.prediction_settings import PredictionSettings
from heteroflow.health.settings import HealthStorageSettings
from heteroflow.health.tool_stalls import ToolStallBook
from heteroflow.health.xid_collection import XidCollectionBook
from heteroflow.platform.auth import Principal
from heteroflow.platform.cards import CardBook
from heteroflow.platform.liveness import LivenessTracker
from heteroflow.platform.nodes import NodeRecord
from heteroflow.platform_server.alert_delivery import AlertNotifier
from heteroflow.platform_server.gpu_metrics import GpuMetricsRecorder
from heteroflow.platform_server.metrics import ServerMetrics
from heteroflow.platform_server.prediction_worker import PredictionWorker
from heteroflow.platform_server.settings import ServerSettings
from heteroflow.platform_server.workers import SiblingMetrics
from heteroflow.storage.alert_store import SqlAlertStore
from heteroflow.storage.health_store import SqlHealthSampleStore
from heteroflow.storage.metrics_store import SqlGpuMetricsStore
from heteroflow.storage.node_store import SqlNodeStore
from heteroflow.storage.prediction_store import SqlPredictionStore
from heteroflow.storage.session_store import SqlSessionStore
from heteroflow.storage.token_store import SqlTokenStore

UNKNOWN_TOKEN_CACHE_SEC = 10.0
"""How long a token found unknown is answered 401 from memory, seconds. A token is 256 random bits: none is
created that was looked up before, so the cache only spares the database a client repeating a wrong token."""

MISSING_NODE_CACHE_SEC = 30.0
"""How long a node id found missing is answered 404 from memory, seconds."""

TOKEN_LOOKUPS_AT_ONCE = 4
"""Uncached token lookups running at once; the others wait (on the loop, without a thread)."""


@dataclass
class ServerContext:
    settings: ServerSettings
    health_settings: HealthStorageSettings
    clock: Clock
    engine: Engine
    tokens: SqlTokenStore
    sessions: SqlSessionStore
    """The web UI's browser sessions (:mod:`heteroflow.platform_server.sessions`)."""
    nodes: SqlNodeStore
    samples: SqlHealthSampleStore
    ingestor: HealthIngestor
    liveness: LivenessTracker
    metrics: ServerMetrics
    prediction_settings: PredictionSettings
    predictions: SqlPredictionStore
    alerts: SqlAlertStore
    worker: PredictionWorker
    notifier: AlertNotifier
    metrics_settings: GpuMetricsSettings
    gpu_metrics: SqlGpuMetricsStore
    metrics_recorder: GpuMetricsRecorder
    token_cache: TtlCache[str, Principal]
    node_cache: TtlCache[NodeId, NodeRecord]
    heartbeat_admission: AdmissionGate
    """Which heartbeats are worked on under overload (:mod:`heteroflow.core.admission`)."""
    node_limit: InFlightByKey
    """Heartbeats in flight per node, the verified speaker (:mod:`heteroflow.core.client_limits`)."""
    peer_limit: InFlightByKey
    """Authenticated requests with a body in flight per peer address."""
    xid_collection: XidCollectionBook
    """Each node's newest word on its XID source (:mod:`heteroflow.health.xid_collection`)."""
    tool_stalls: ToolStallBook
    """Each node's newest word on its stalled vendor tools (:mod:`heteroflow.health.tool_stalls`)."""
    cards: CardBook
    """Each node's cards and its hour's new cards and XID events (:mod:`heteroflow.platform.cards`)."""
    failed_credentials: FailedCredentials
    """401s per peer address and per presented token (:mod:`heteroflow.core.auth_failures`)."""
    unknown_tokens: TtlCache[str, bool] = field(
        default_factory=lambda: TtlCache(ttl_sec=UNKNOWN_TOKEN_CACHE_SEC, max_entries=10_000)
    )
    """Hashes of tokens just found unknown: answered 401 without a statement for a while."""
    missing_nodes: TtlCache[str, bool] = field(
        default_factory=lambda: TtlCache(ttl_sec=MISSING_NODE_CACHE_SEC, max_entries=100_000)
    )
    """Node ids just found missing: a heartbeat for one is 404 from memory for a while (ids are uuid4 made by
    the server: none appears later that was missing before)."""
    token_lookups: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(TOKEN_LOOKUPS_AT_ONCE))
    """Token lookups running at once (each is a thread and a statement)."""
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    siblings: SiblingMetrics | None = None
    """The other worker processes of this host (``--workers``): /metrics answers for all of them."""

    def forget_node(self, node_id: NodeId) -> None:
        """Drop every in-memory trace of a deleted node."""
        self.node_cache.discard(node_id)
        self.liveness.forget(node_id)
        self.ingestor.forget_node(node_id)
        self.metrics_recorder.forget_node(node_id)
        self.xid_collection.forget_node(node_id)
        self.tool_stalls.forget_node(node_id)
        self.cards.forget(node_id)
