"""Coordinator settings (``HETEROFLOW_COORDINATOR_…`` plus ``HETEROFLOW_CLUSTER_TOKEN``); CLI options win.

Secure by default: with no cluster token the management routes refuse every call, and with no API key
source (``api_key_hashes`` or ``platform_url``) every OpenAI request is refused. An invalid value falls back
to its default with a warning (:class:`~heteroflow.core.settings.LenientSettings`), so a typo in a key list
closes the door instead of opening it.
"""

from __future__ import annotations

import re
from typing import Self

import structlog
from pydantic import AliasChoices, Field, field_validator, model_validator

from heteroflow.core.settings import LenientSettings, env_names
from heteroflow.serving.coordinator.auth import MAX_IN_FLIGHT_PER_KEY

_log = structlog.get_logger(__name__)

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def parse_key_hashes(text: str) -> frozenset[str]:
    """``"<hex>,<hex>"`` → the set of digests (lower case); raises ``ValueError`` for anything that is not one."""
    digests: set[str] = set()
    for part in text.split(","):
        digest = part.strip().lower()
        if not digest:
            continue
        if not _SHA256_HEX.fullmatch(digest):
            # never echo the value: an operator may have pasted a key instead of its digest
            raise ValueError("every entry must be the 64-character hex sha256 digest of an API key")
        digests.add(digest)
    return frozenset(digests)


class CoordinatorSettings(LenientSettings):
    """Tunables of the Coordinator, which routes OpenAI requests to the published endpoints."""

    host: str = Field(
        default="127.0.0.1",
        min_length=1,
        validation_alias=env_names("coordinator_host"),
        description="Bind address of the Coordinator (default loopback).",
    )
    port: int = Field(
        default=8400,
        ge=1,
        le=65535,
        validation_alias=env_names("coordinator_port"),
        description="TCP port of the Coordinator (default 8400).",
    )
    management_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        validation_alias=env_names("coordinator_management_port"),
        description=(
            "A second TCP port (on the same host) that serves only the management routes (DEL/ADD/SET, "
            "/coordinator/instances) from a thread and event loop of their own, so that a withdrawal takes "
            "effect within milliseconds however loaded the OpenAI listener is (default unset: the management "
            "routes are on the main port only; they stay there too when this is set)."
        ),
    )
    management_nice: int = Field(
        default=-10,
        ge=-20,
        le=19,
        validation_alias=env_names("coordinator_management_nice"),
        description=(
            "Scheduling priority (nice value) of the management listener's thread (default -10: the CPU goes to "
            "a DEL before the OpenAI traffic and the engines beside it). Raising a priority needs CAP_SYS_NICE "
            "(root has it); without it the thread keeps the process's priority and the Coordinator logs "
            "coordinator.management_priority_unchanged. 0 leaves it alone."
        ),
    )
    cluster_token: str | None = Field(
        default=None,
        validation_alias=env_names("cluster_token"),
        description=(
            "Bearer token of the management routes and /metrics, also sent to the engines (which guard their "
            "OpenAI routes with it). Unset: management routes and /metrics answer 401."
        ),
    )
    api_key_hashes: str = Field(
        default="",
        validation_alias=env_names("coordinator_api_key_hashes"),
        description=(
            "Comma-separated sha256 hex digests of the API keys accepted on the OpenAI routes "
            "(default none). A malformed list is dropped whole."
        ),
    )
    platform_url: str | None = Field(
        default=None,
        validation_alias=env_names("coordinator_platform_url"),
        description=(
            "Base URL of the HeteroFlow platform server; an API key it accepts on GET /healthz is valid here "
            "too (default none)."
        ),
    )
    platform_token_cache_sec: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        validation_alias=env_names("coordinator_platform_token_cache_sec"),
        description="Seconds a key the platform accepted is trusted without asking again (default 30; 0 = always ask).",
    )
    platform_timeout_sec: float = Field(
        default=5.0,
        gt=0,
        le=60,
        validation_alias=env_names("coordinator_platform_timeout_sec"),
        description="Timeout of one key check against the platform (default 5 s); beyond it the request gets 503.",
    )
    client_deadline_sec: float = Field(
        default=30.0,
        ge=0,
        le=600,
        validation_alias=AliasChoices(
            "HETEROFLOW_COORDINATOR_CLIENT_DEADLINE_SEC",
            "HETEROFLOW_COORDINATOR_UNAVAILABLE_WAIT_SEC",
            "client_deadline_sec",
            "unavailable_wait_sec",
        ),
        description=(
            "How long a request that has sent nothing to its client yet may be held and re-routed while its "
            "engines are faulted, withdrawn or rebuilding (default 30 s); past it: 503 with Retry-After. The "
            "same bound applies to resuming a cut stream. HETEROFLOW_COORDINATOR_UNAVAILABLE_WAIT_SEC is read "
            "as its older name."
        ),
    )
    faulted_first_byte_sec: float = Field(
        default=1.0,
        gt=0,
        le=60,
        validation_alias=env_names("coordinator_faulted_first_byte_sec"),
        description=(
            "Once an endpoint is reported faulted (a DEL with faulted), how long a request already sent to it "
            "may still wait for its answer (a stream: its next event) before it is sent elsewhere (default 1 s)."
        ),
    )
    fault_pause_sec: float = Field(
        default=1.0,
        gt=0,
        le=60,
        validation_alias=env_names("coordinator_fault_pause_sec"),
        description=(
            "How long an endpoint that answered with a fault is skipped by every request, unless it is "
            "published again sooner (default 1 s)."
        ),
    )
    retry_after_sec: int = Field(
        default=2,
        ge=1,
        le=3600,
        validation_alias=env_names("coordinator_retry_after_sec"),
        description="Retry-After (seconds) of a 503 answered for lack of a published or healthy endpoint (default 2).",
    )
    max_body_bytes: int = Field(
        default=1024 * 1024,
        ge=1024,
        le=256 * 1024 * 1024,
        validation_alias=env_names("coordinator_max_body_bytes"),
        description="Largest request body accepted on the OpenAI routes (default 1 MiB); larger → 413.",
    )
    body_read_timeout_sec: float = Field(
        default=10.0,
        gt=0,
        le=600,
        validation_alias=env_names("coordinator_body_read_timeout_sec"),
        description=(
            "Longest time a request body may take to arrive once its key is verified (default 10 s); a slower "
            "sender is answered 408 and its connection closed, before any engine sees the request."
        ),
    )
    max_in_flight_per_peer: int = Field(
        default=500,
        ge=1,
        le=100000,
        validation_alias=env_names("coordinator_max_in_flight_per_peer"),
        description=(
            "OpenAI requests with a verified key that one peer address may have in flight at once (default 500, "
            "half the default pool); one more is answered 429 with Retry-After before its body is read. Generous "
            "on purpose: the clients behind one NAT or gateway share an address; raise it there."
        ),
    )
    upstream_connect_timeout_sec: float = Field(
        default=2.0,
        gt=0,
        le=60,
        validation_alias=env_names("coordinator_upstream_connect_timeout_sec"),
        description="TCP connect timeout to an engine (default 2 s); a timeout is retried on another endpoint.",
    )
    upstream_first_byte_timeout_sec: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        validation_alias=env_names("coordinator_upstream_first_byte_timeout_sec"),
        description=(
            "Longest wait for an engine's response headers, and for each later chunk (default 60 s); "
            "before the first byte reached the client a timeout is retried."
        ),
    )
    upstream_total_timeout_sec: float = Field(
        default=600.0,
        gt=0,
        le=86400,
        validation_alias=env_names("coordinator_upstream_total_timeout_sec"),
        description="Longest time one request may take end to end, retry and streaming included (default 600 s).",
    )
    upstream_max_connections: int = Field(
        default=1000,
        ge=1,
        le=100000,
        validation_alias=env_names("coordinator_upstream_max_connections"),
        description="Size of the connection pool to the engines (default 1000).",
    )
    max_concurrent_requests: int = Field(
        default=1000,
        ge=1,
        le=100000,
        validation_alias=env_names("coordinator_max_concurrent_requests"),
        description=(
            "OpenAI requests handled at once, a stream until its last byte (default 1000, the upstream pool's "
            "size); one more is answered 503 with Retry-After before its key or body is read. Beyond the pool "
            "a request would only wait for a connection, up to the first-byte timeout."
        ),
    )
    max_in_flight_per_key: int = Field(
        default=MAX_IN_FLIGHT_PER_KEY,
        ge=1,
        le=100000,
        validation_alias=env_names("coordinator_max_in_flight_per_key"),
        description=(
            "OpenAI requests one API key may have handled at once, counted like max_concurrent_requests: from "
            "its arrival until its last byte, a request held during a round included (default 64); one more of "
            "that key is answered 503 with Retry-After (outcome key_busy). At max_concurrent_requests or above "
            "there is no share per key (set it so where all traffic comes through one key)."
        ),
    )
    max_in_flight_per_tenant: int = Field(
        default=500,
        ge=1,
        le=100000,
        validation_alias=env_names("coordinator_max_in_flight_per_tenant"),
        description=(
            "OpenAI requests the platform keys of one tenant may have handled at once, counted like "
            "max_in_flight_per_key (default 500, half the default pool): one tenant with many keys cannot take "
            "the whole pool. One more is answered 503 with Retry-After (outcome key_busy). Keys without a tenant "
            "(configured key hashes, tenant-less platform tokens) are the operator's and not counted. At "
            "max_concurrent_requests or above there is no share per tenant."
        ),
    )
    max_failed_keys: int = Field(
        default=20,
        ge=1,
        le=1_000_000,
        validation_alias=env_names("coordinator_max_failed_keys"),
        description=(
            "401s one peer address, or one presented key, may cause per failed_keys_window_sec (default 20). "
            "Beyond it that address or key is answered 429 with Retry-After (the rest of the window, outcome "
            "key_throttled) before any key check against the platform; a key this Coordinator holds as valid is "
            "never refused for its address. Refusals are logged once per address or key and window."
        ),
    )
    failed_keys_window_sec: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        validation_alias=env_names("coordinator_failed_keys_window_sec"),
        description="The window of max_failed_keys, seconds (default 60).",
    )
    keep_alive_timeout_sec: int = Field(
        default=65,
        ge=1,
        le=3600,
        validation_alias=env_names("coordinator_keep_alive_timeout_sec"),
        description=(
            "How long an idle client connection is kept open (default 65 s). Longer than the clients' own idle "
            "expiry (httpx and the openai client: 5 s), so that a client never sends a request on a connection "
            "the Coordinator is closing at that moment (it would see a reset instead of an answer)."
        ),
    )
    log_level: str = Field(
        default="info",
        pattern=r"^(?i:debug|info|warning|error|critical)$",
        validation_alias=env_names("coordinator_log_level"),
        description="Log level (default info).",
    )

    @model_validator(mode="after")
    def _drop_malformed_key_list(self) -> Self:
        # Not a field validator: the generic fallback warning repeats the rejected value, and an operator who
        # pasted a key instead of its digest must not find the key in the logs. Same rule, value withheld.
        try:
            digests = parse_key_hashes(self.api_key_hashes)
        except ValueError:
            warning = (
                "invalid value for HETEROFLOW_COORDINATOR_API_KEY_HASHES (not repeated: it may hold a key; every "
                "entry must be a sha256 hex digest); using the default '' (no key accepted)"
            )
            object.__setattr__(self, "api_key_hashes", "")
            object.__setattr__(self, "_key_list_warning", warning)
            _log.warning("config.invalid_value", settings=type(self).__name__, detail=warning)
        else:
            object.__setattr__(self, "api_key_hashes", ",".join(sorted(digests)))
        return self

    @property
    def config_warnings(self) -> tuple[str, ...]:
        own = getattr(self, "_key_list_warning", None)
        return (*super().config_warnings, *((own,) if own else ()))

    @field_validator("platform_url")
    @classmethod
    def _valid_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        url = value.strip().rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ValueError("the platform URL must start with http:// or https://")
        return url

    @field_validator("cluster_token")
    @classmethod
    def _blank_is_unset(cls, value: str | None) -> str | None:
        return value if value and value.strip() else None

    @property
    def api_key_digests(self) -> frozenset[str]:
        return parse_key_hashes(self.api_key_hashes)
