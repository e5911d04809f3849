"""Settings of the platform server process."""

from __future__ import annotations

import math
from pathlib import Path

from pydantic import Field

from heteroflow.core.settings import LenientSettings, env_names
from heteroflow.platform.cards import CardLimits


def default_database_url() -> str:
    return f"sqlite:///{Path.home() / '.local' / 'share' / 'heteroflow' / 'heteroflow.db'}"


class ServerSettings(LenientSettings):
    """Where the server listens, what it stores into, and how it paces liveness and auth caching."""

    @property
    def card_limits(self) -> CardLimits:
        """What one node may report (:mod:`heteroflow.platform.cards`)."""
        return CardLimits(
            new_cards_per_hour=self.max_new_cards_per_node_hour,
            xid_events_per_beat=self.max_xid_events_per_beat,
            xid_events_per_hour=self.max_xid_events_per_node_hour,
        )

    @property
    def heartbeat_tenant_slots(self) -> int:
        """The most heartbeat slots one tenant may hold (:attr:`heartbeat_share_per_tenant` of the gate)."""
        return max(1, math.floor(self.max_in_flight_heartbeats * self.heartbeat_share_per_tenant))

    @property
    def heartbeat_token_slots(self) -> int:
        """The most heartbeat slots one token's nodes may hold (:attr:`heartbeat_share_per_token` of a tenant's)."""
        return max(1, math.floor(self.heartbeat_tenant_slots * self.heartbeat_share_per_token))

    host: str = Field(
        default="127.0.0.1",
        min_length=1,
        validation_alias=env_names("server_host"),
        description="Address to bind (default loopback; set 0.0.0.0 explicitly to serve other hosts).",
    )
    port: int = Field(default=8080, ge=1, le=65535, validation_alias=env_names("server_port"), description="TCP port.")
    workers: int = Field(
        default=1,
        ge=1,
        le=64,
        validation_alias=env_names("server_workers"),
        description=(
            "Server processes on this host sharing the port (default 1; at most 64). Each is a replica with its "
            "own in-memory state, as separate servers are; /metrics answers for all of them. More than one "
            "needs PostgreSQL: SQLite takes one writer at a time."
        ),
    )
    gc_young_threshold: int = Field(
        default=50_000,
        ge=0,
        le=10_000_000,
        validation_alias=env_names("server_gc_young_threshold"),
        description=(
            "After start-up, freeze the start-up objects out of the garbage collector's scans and collect the "
            "young generation every this many new objects (default 50,000; CPython's is 700), so that full "
            "collections, which pause every request, come seldom (core/collector.py). 0 leaves the collector "
            "as it is."
        ),
    )
    switch_interval_ms: float = Field(
        default=0.5,
        gt=0,
        le=100,
        validation_alias=env_names("server_switch_interval_ms"),
        description=(
            "The interpreter's thread switch interval, milliseconds (default 0.5; Python's own is 5). The event "
            "loop gives the interpreter lock up at every socket read and write, and while a worker thread runs "
            "Python (a /metrics scrape's formatting, the minute flush's rows) it waits up to this long to get it "
            "back each time: at 5 ms the loop's turns during a fleet's scrape took 4.7-5.5 ms instead of 1.1 "
            "(bench/scrape_stall.py, docs/benchmarks.md)."
        ),
    )
    keep_alive_timeout_seconds: int = Field(
        default=30,
        ge=25,
        le=3600,
        validation_alias=env_names("server_keep_alive_timeout_seconds"),
        description=(
            "How long an idle client connection is kept open (default 30 s; at least 25). An agent keeps its "
            "connection between beats for up to 20 s, so that each beat reuses it instead of opening one (a "
            "beat on a connection of its own costs the server 1.3-1.4 times the CPU: docs/benchmarks.md). "
            "Longer than that, so that no agent sends a beat on a connection the server is closing at that "
            "moment (it would see a reset instead of an answer)."
        ),
    )
    database_url: str = Field(
        default_factory=default_database_url,
        min_length=1,
        validation_alias=env_names("database_url"),
        description=(
            "SQLAlchemy URL: sqlite:///PATH (default ~/.local/share/heteroflow/heteroflow.db) or "
            "postgresql://user:pass@host:port/db (psycopg 3) in production."
        ),
    )
    heartbeat_interval_seconds: float = Field(
        default=5.0,
        gt=0,
        validation_alias=env_names("heartbeat_interval_seconds"),
        description="Heartbeat period the server asks agents to keep (default 5 s).",
    )
    offline_after_seconds: float = Field(
        default=30.0,
        gt=0,
        validation_alias=env_names("offline_after_seconds"),
        description=(
            "A node whose newest heartbeat is older than this is offline (default 30 s: several missed "
            "beats plus one liveness flush interval, so a node is not flapped by one late beat)."
        ),
    )
    liveness_flush_seconds: float = Field(
        default=5.0,
        gt=0,
        validation_alias=env_names("liveness_flush_seconds"),
        description=(
            "Every node's newest heartbeat is written to the database once per this interval, in one "
            "statement for all nodes, and cached tokens are re-confirmed in one more (default 5 s)."
        ),
    )
    node_reissue_hold_seconds: float = Field(
        default=3600.0,
        gt=0,
        validation_alias=env_names("node_reissue_hold_seconds"),
        description=(
            "For this long after a node's credential is issued again (an operator's release claimed, or an "
            "administrator's token), the node's hardware events are marked identity_changed in the hardware-events "
            "feed and the serving controller holds them for an operator instead of retiring ranks on them "
            "(default 3600 s). Whoever claimed the credential may not be the node's agent."
        ),
    )
    max_new_cards_per_node_hour: int = Field(
        default=16,
        ge=1,
        validation_alias=env_names("max_new_cards_per_node_hour"),
        description=(
            "Card uuids a node may report per hour at an index that had another uuid (default 16): a card swap "
            "is normal, hundreds of new cards an hour are not. Beyond it, that card's reading is refused (the beat "
            "is answered), counted in the node's cards status, and the node's first refused card raises "
            "NODE_CARDS_REFUSED. A card at an index beyond the node's gpu_count card slots is always refused."
        ),
    )
    max_xid_events_per_beat: int = Field(
        default=256,
        ge=1,
        validation_alias=env_names("max_xid_events_per_beat"),
        description=(
            "XID events of one heartbeat that are stored (default 256); the rest are rejected with the reason "
            "(not retried) and counted in the node's cards status."
        ),
    )
    max_xid_events_per_node_hour: int = Field(
        default=1000,
        ge=1,
        validation_alias=env_names("max_xid_events_per_node_hour"),
        description=(
            "XID events of one node stored per hour (default 1000): with the node's cards, the bound of what one "
            "node adds to the database. The rest are rejected with the reason and counted; raise it for a node "
            "that legitimately reports more."
        ),
    )
    max_nodes_per_token: int = Field(
        default=5_000,
        ge=1,
        validation_alias=env_names("max_nodes_per_token"),
        description=(
            "Nodes one agent token may create (default 5000); registering one more answers 429. A stolen token "
            "cannot fill the node list, the metrics or the database with invented nodes."
        ),
    )
    max_cards_per_token: int = Field(
        default=40_000,
        ge=1,
        validation_alias=env_names("max_cards_per_token"),
        description="Cards (gpu_count summed) across the nodes one agent token created (default 40000); beyond: 429.",
    )
    auth_cache_seconds: float = Field(
        default=60.0,
        ge=0,
        validation_alias=env_names("auth_cache_seconds"),
        description=(
            "A verified token is trusted from memory for this long without a new check (default 60 s). "
            "Cached tokens are re-confirmed together every liveness flush, so a revoked token stops working "
            "within one flush interval on every server; while the database is down, tokens verified earlier "
            "keep working."
        ),
    )
    web_session_seconds: float = Field(
        default=8 * 3600.0,
        ge=60,
        le=7 * 24 * 3600.0,
        validation_alias=env_names("web_session_seconds"),
        description=(
            "How long a web UI sign-in lasts (default 8 h, at most 7 days): the browser session cookie's "
            "Max-Age and the server-side session's end. Signing out, or revoking the token it was made from, "
            "ends it at once; signing in again starts a new one."
        ),
    )
    node_cache_seconds: float = Field(
        default=60.0,
        ge=0,
        validation_alias=env_names("node_cache_seconds"),
        description=(
            "A node's registration is trusted from memory for this long on the heartbeat path (default "
            "60 s). Beating nodes are re-confirmed by every liveness flush, so a node deleted through "
            "another server is refused (404, the agent re-registers) within one flush interval."
        ),
    )
    max_in_flight_heartbeats: int = Field(
        default=256,
        ge=1,
        validation_alias=env_names("server_max_in_flight_heartbeats"),
        description=(
            "Heartbeats the server works on at once (default 256); one more is answered 503 with Retry-After "
            "(the heartbeat interval) before its body is read. Without a bound an overloaded server answers "
            "every beat after the agents' 5 s timeout, so all its work is wasted; with it the admitted beats "
            "stay fast. At about 3 ms of CPU per beat, 256 beats in flight are under a second of work."
        ),
    )
    heartbeat_share_per_tenant: float = Field(
        default=0.5,
        gt=0,
        le=1,
        validation_alias=env_names("server_heartbeat_share_per_tenant"),
        description=(
            "The part of max_in_flight_heartbeats one tenant's nodes may hold at once (default 0.5: 128 of 256; "
            "the nodes of no tenant count as one tenant). One more of that tenant is answered 503 with "
            "Retry-After before its body is read, while the other tenants' beats still find a slot: one tenant "
            "with many nodes and slow bodies cannot take the whole gate. Honest fleets keep about N/1000 beats in "
            "flight (N nodes beating every 5 s), far under their share."
        ),
    )
    heartbeat_share_per_token: float = Field(
        default=0.5,
        gt=0,
        le=1,
        validation_alias=env_names("server_heartbeat_share_per_token"),
        description=(
            "The part of a tenant's share that the nodes one token registered may hold at once (default 0.5: 64 "
            "of the tenant's 128), so that one leaked agent token cannot take its whole tenant's share either."
        ),
    )
    max_failed_credentials: int = Field(
        default=20,
        ge=1,
        validation_alias=env_names("server_max_failed_credentials"),
        description=(
            "401s one peer address, or one presented token, may cause per failed_credentials_window_seconds "
            "(default 20). Beyond it that address or token is answered 429 with Retry-After (the rest of the "
            "window) before any lookup, body read or log line; a request with a token this server holds as valid "
            "is never refused for its address. Refusals are logged once per address or token and window."
        ),
    )
    failed_credentials_window_seconds: float = Field(
        default=60.0,
        gt=0,
        validation_alias=env_names("server_failed_credentials_window_seconds"),
        description="The window of max_failed_credentials, seconds (default 60).",
    )
    max_in_flight_per_node: int = Field(
        default=4,
        ge=1,
        validation_alias=env_names("server_max_in_flight_per_node"),
        description=(
            "Heartbeats one node may have in flight at once (default 4; an agent beats one at a time, a retry "
            "may overlap the beat it replaces). The node is the verified speaker: its credential is checked "
            "before the slot is taken. One more is answered 429 with Retry-After before its body is read, so "
            "one node's (or one stolen credential's) slow bodies never fill the heartbeat admission gate."
        ),
    )
    max_in_flight_per_peer: int = Field(
        default=128,
        ge=1,
        validation_alias=env_names("server_max_in_flight_per_peer"),
        description=(
            "Authenticated requests with a body (heartbeats, registrations, every POST/PUT/PATCH/DELETE) one peer "
            "address may have in flight at once (default 128, half the heartbeat gate); one more is answered 429 "
            "with Retry-After before its body is read. Generous on purpose: agents behind one NAT, or every "
            "request through an ingress, share an address; raise it there (a fleet of N nodes beating every 5 s "
            "at a few ms a beat keeps about N/1000 in flight)."
        ),
    )
    heartbeat_shed_lag_seconds: float = Field(
        default=2.0,
        gt=0,
        validation_alias=env_names("server_heartbeat_shed_lag_seconds"),
        description=(
            "While the server's event loop runs this late (default 2 s), new heartbeats are answered 503 with "
            "Retry-After until it catches up. A beat served from memory never waits inside the server, so "
            "under overload the queue forms before it (sockets, the loop's ready queue), where the in-flight "
            "bound cannot see it; the loop's lag is that wait. Under the agents' 5 s timeout with room for the "
            "beat itself; lower, it refuses beats that would still have been answered in time."
        ),
    )
    log_level: str = Field(
        default="info",
        pattern="^(debug|info|warning|error)$",
        validation_alias=env_names("log_level"),
        description="debug, info, warning or error.",
    )
    controller_url: str | None = Field(
        default=None,
        pattern=r"^https?://[^\s/]+[^\s]*$",
        validation_alias=env_names("server_controller_url"),
        description=(
            "Base URL of the serving controller (e.g. http://127.0.0.1:8500) that the serving dashboard's proxy "
            "routes (/api/v1/serving/…) forward to. Unset (the default): those routes answer 503 "
            "'no controller configured'."
        ),
    )
    cluster_token: str | None = Field(
        default=None,
        validation_alias=env_names("cluster_token"),
        description=(
            "The cluster token the serving proxy sends to the controller (the same HETEROFLOW_CLUSTER_TOKEN "
            "the controller requires). It stays on the server: the browser only ever holds its own API token."
        ),
    )
