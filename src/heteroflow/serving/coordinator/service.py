"""The Coordinator's shell: published views, forwarder, key verifier, metrics and the upstream connection pool.

Its HTTP face is :mod:`.routes` (thin handlers over :class:`Coordinator`), put together with the middleware by
:mod:`.assembly`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import httpx
import structlog

from heteroflow.contracts.serving import ViewAddRequest, ViewDelRequest, ViewSetRequest
from heteroflow.core.admission import AdmissionGate, AdmissionStatus
from heteroflow.core.auth_failures import FailedCredentials
from heteroflow.core.client_limits import InFlightByKey
from heteroflow.core.clock import Clock, SystemClock
from heteroflow.http.tls import client_tls
from heteroflow.serving.coordinator.attempt import UpstreamTimeouts
from heteroflow.serving.coordinator.auth import ApiKeyVerifier, KeyChecker, PlatformKeyChecker
from heteroflow.serving.coordinator.errors import ViewConflictError
from heteroflow.serving.coordinator.metrics import CoordinatorMetrics
from heteroflow.serving.coordinator.proxy import Forwarder
from heteroflow.serving.coordinator.settings import CoordinatorSettings
from heteroflow.serving.coordinator.views import (
    InstanceView,
    Lease,
    ModelMismatchError,
    PublicationSignal,
    ServingViews,
    ViewChange,
)

_log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class CoordinatorStatus:
    """What the Coordinator publishes and carries now, and how it is configured (no secrets)."""

    instances: tuple[InstanceView, ...]
    in_flight: Mapping[str, int]
    """Upstream requests in flight per ``instance/endpoint`` (a withdrawn endpoint stays until they finish)."""
    waiting_for_publication: int
    """Requests waiting now for a publication of their model (the unavailable wait)."""
    stale_generations_ignored: int
    api_keys_configured: bool
    management_enabled: bool
    config_warnings: tuple[str, ...]
    admission: AdmissionStatus
    """OpenAI requests in flight against ``max_concurrent_requests``, and those refused with 503."""


class Coordinator:
    """The Coordinator's shell: views, forwarder, key verifier, metrics and the upstream connection pool."""

    def __init__(
        self,
        *,
        settings: CoordinatorSettings,
        clock: Clock | None = None,
        upstream_transport: httpx.AsyncBaseTransport | None = None,
        key_checker: KeyChecker | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock or SystemClock()
        self.views = ServingViews()
        self.publications = PublicationSignal()
        self.admission = AdmissionGate(max_in_flight=settings.max_concurrent_requests)
        self.metrics = CoordinatorMetrics(
            self.views.status, waiting=lambda: self.publications.waiting, admission=self.admission.status
        )
        timeouts = UpstreamTimeouts(
            connect=settings.upstream_connect_timeout_sec,
            first_byte=settings.upstream_first_byte_timeout_sec,
            total=settings.upstream_total_timeout_sec,
        )
        self._client = httpx.AsyncClient(
            verify=client_tls(trust_env=False),
            timeout=timeouts.httpx(),
            limits=httpx.Limits(
                max_connections=settings.upstream_max_connections,
                max_keepalive_connections=min(settings.upstream_max_connections, 256),
            ),
            transport=upstream_transport,
            follow_redirects=False,
            trust_env=False,  # engine traffic never goes through an HTTP proxy from the environment
        )
        self.forwarder = Forwarder(
            views=self.views,
            client=self._client,
            timeouts=timeouts,
            client_deadline_sec=settings.client_deadline_sec,
            faulted_first_byte_sec=settings.faulted_first_byte_sec,
            fault_pause_sec=settings.fault_pause_sec,
            retry_after_sec=settings.retry_after_sec,
            upstream_token=settings.cluster_token,
            metrics=self.metrics,
            publications=self.publications,
        )
        if key_checker is None and settings.platform_url is not None:
            key_checker = PlatformKeyChecker(base_url=settings.platform_url, timeout_sec=settings.platform_timeout_sec)
        self.keys = ApiKeyVerifier(
            digests=settings.api_key_digests,
            platform=key_checker,
            clock=self.clock,
            cache_sec=settings.platform_token_cache_sec,
            # a share as large as the pool is no share: when one key has the whole pool, the Coordinator is full
            # and its answer is the admission gate's ("overloaded"), not "this key is busy"
            max_in_flight_per_key=(
                settings.max_in_flight_per_key
                if settings.max_in_flight_per_key < settings.max_concurrent_requests
                else None
            ),
            max_in_flight_per_tenant=(
                settings.max_in_flight_per_tenant
                if settings.max_in_flight_per_tenant < settings.max_concurrent_requests
                else None
            ),
        )
        self.failed_keys = FailedCredentials(
            max_failures=settings.max_failed_keys, window_sec=settings.failed_keys_window_sec
        )
        """401s per peer address and per presented key (:mod:`heteroflow.core.auth_failures`)."""
        self.peer_limit = InFlightByKey(max_per_client=settings.max_in_flight_per_peer)
        """OpenAI requests with a verified key in flight per peer address (:mod:`heteroflow.core.client_limits`)."""

        self.main_loop: asyncio.AbstractEventLoop | None = None
        """The OpenAI listener's loop (set when its app starts): a management call from the management listener's
        loop hands it what touches requests (wake-ups, faulted bounds)."""

    def _on_main(self, work: Callable[[], object]) -> None:
        """Run ``work`` on the OpenAI listener's loop: now when this is it, else as soon as that loop runs."""
        main = self.main_loop
        try:
            current: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        if main is None or main is current or main.is_closed():
            work()
        else:
            main.call_soon_threadsafe(work)

    # -- management (F-40) ---------------------------------------------------------------------------------
    async def delete(self, request: ViewDelRequest) -> ViewChange:
        change = self.views.delete(request)
        if request.faulted:

            def bound() -> None:
                shortened = self.forwarder.faulted(request.instance_id, request.endpoint_ids)
                if shortened:
                    _log.info("coordinator.faulted_attempts_bounded", instance=request.instance_id, attempts=shortened)

            self._on_main(bound)
        return await self._applied("DEL", request.instance_id, request.request_id, change, request.generation)

    async def add(self, request: ViewAddRequest) -> ViewChange:
        try:
            change = self.views.add(request)
        except ModelMismatchError as exc:
            self.metrics.view_operations.labels(op="ADD", outcome="model_mismatch").inc()
            _log.warning("coordinator.view_refused", op="ADD", instance=request.instance_id, detail=str(exc))
            raise ViewConflictError(str(exc)) from exc
        return await self._applied("ADD", request.instance_id, request.request_id, change, request.generation)

    async def replace(self, request: ViewSetRequest) -> ViewChange:
        change = self.views.replace(request)
        return await self._applied("SET", request.instance_id, request.request_id, change, request.generation)

    async def _applied(
        self, op: str, instance_id: str, request_id: str | None, change: ViewChange, generation: int | None = None
    ) -> ViewChange:
        # logged before held requests are woken: the change took effect at the swap, and a woken request's
        # "forwarded" line must never precede the publication that let it go (the soak's invariant 2 reads both)
        _log.info(
            "coordinator.view_changed",
            op=op,
            instance=instance_id,
            outcome=change.outcome.value,
            generation=generation,
            withdrawn=sorted(key.endpoint_id for key in change.withdrawn),
            published=sorted(key.endpoint_id for key in change.published),
            request_id=request_id,
            detail=change.detail or None,
        )
        if change.published:
            self._on_main(self.publications.notify)
        if change.sending:
            # a request that passed the last check just before the swap is writing its headers now: the
            # operation returns only once they are out, so "returned" really means "nothing new goes there"
            sent = await self._sent(change.sending)
            if not sent:
                _log.warning("coordinator.withdraw_drain_timeout", op=op, instance=instance_id)
        self.metrics.view_operations.labels(op=op, outcome=change.outcome.value).inc()
        return change

    async def _sent(self, leases: tuple[Lease, ...]) -> bool:
        within = self.settings.upstream_connect_timeout_sec
        main = self.main_loop
        if main is None or main is asyncio.get_running_loop():
            return await self.forwarder.wait_sent(leases, within=within)
        # another loop: the leases' events belong to the OpenAI loop, so watch their state instead
        deadline = self.clock.monotonic() + within
        while self.views.still_sending(leases):
            if self.clock.monotonic() > deadline:
                return False
            await self.clock.sleep(0.0005)  # a header write lasts microseconds
        return True

    # -- status and lifecycle ------------------------------------------------------------------------------
    def status(self) -> CoordinatorStatus:
        snap = self.views.status()
        return CoordinatorStatus(
            instances=snap.instances,
            in_flight={key.label: count for key, count in sorted(snap.in_flight.items())},
            waiting_for_publication=self.publications.waiting,
            stale_generations_ignored=snap.generation_refusals,
            api_keys_configured=self.keys.configured,
            management_enabled=self.settings.cluster_token is not None,
            config_warnings=self.settings.config_warnings,
            admission=self.admission.status(),
        )

    async def aclose(self) -> None:
        await self._client.aclose()
        await self.keys.aclose()
