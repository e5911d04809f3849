"""``ResourceMonitorSettings``: which hardware fault sources the controller runs, and how (environment only).

Every source is off by default, so a controller without these variables behaves exactly as before: the
Kubernetes watch is switched on by ``HETEROFLOW_MONITOR_KUBE_ENABLED``, the directory source by a directory, the
GPU-health source by a platform URL. An invalid value falls back to its default with a warning (H-25), like
every other group.
"""

from __future__ import annotations

from pydantic import Field

from heteroflow.core.settings import LenientSettings, env_names

from .mindcluster import DEFAULT_NAME_PREFIX, DEFAULT_NAMESPACE


class ResourceMonitorSettings(LenientSettings):
    kube_enabled: bool = Field(
        default=False,
        validation_alias=env_names("monitor_kube_enabled"),
        description=(
            "Watch the MindCluster ConfigMaps and the Nodes through the Kubernetes API (default false). Uses the "
            "in-cluster service account, else the kubeconfig."
        ),
    )
    kube_namespace: str = Field(
        default=DEFAULT_NAMESPACE,
        min_length=1,
        max_length=63,
        validation_alias=env_names("monitor_kube_namespace"),
        description="Namespace of the device-info ConfigMaps (default kube-system).",
    )
    kube_name_prefix: str = Field(
        default=DEFAULT_NAME_PREFIX,
        min_length=1,
        max_length=200,
        validation_alias=env_names("monitor_kube_name_prefix"),
        description="Name prefix of the device-info ConfigMaps; the rest of the name is the node (default "
        "mindx-dl-deviceinfo-).",
    )
    kube_watch_nodes: bool = Field(
        default=True,
        validation_alias=env_names("monitor_kube_watch_nodes"),
        description="Also watch Node readiness: a NotReady node is an L6 node-level fault (default true).",
    )
    kubeconfig: str | None = Field(
        default=None,
        validation_alias=env_names("monitor_kubeconfig"),
        description="A kubeconfig file to use instead of the in-cluster configuration (default: none).",
    )
    kube_watch_timeout_sec: int = Field(
        default=300,
        ge=10,
        le=3600,
        validation_alias=env_names("monitor_kube_watch_timeout_sec"),
        description="Server-side lifetime of one watch request before it is renewed (default 300 s).",
    )
    directory: str | None = Field(
        default=None,
        validation_alias=env_names("monitor_directory"),
        description=(
            "A folder of *.json files, one MindCluster ConfigMap (or Node) document each, polled for changes. "
            "Unset: the directory source is off."
        ),
    )
    directory_poll_sec: float = Field(
        default=5.0,
        gt=0,
        le=3600,
        validation_alias=env_names("monitor_directory_poll_sec"),
        description="Period of the directory scan; a file is read again only when its mtime or size moves (5 s).",
    )
    platform_url: str | None = Field(
        default=None,
        validation_alias=env_names("monitor_platform_url"),
        description=(
            "The HeteroFlow platform server whose /api/v1/hardware-events feed is polled (XID events, "
            "uncorrectable-ECC and remap-failure increases). Unset: the GPU-health source is off."
        ),
    )
    platform_token: str | None = Field(
        default=None,
        validation_alias=env_names("monitor_platform_token"),
        description="The monitor's own platform token (scope nodes:read; a tenant's token sees its nodes only).",
    )
    platform_poll_sec: float = Field(
        default=5.0,
        gt=0,
        le=3600,
        validation_alias=env_names("monitor_platform_poll_sec"),
        description="Period of the platform poll (default 5 s).",
    )
    platform_fault_hold_sec: float = Field(
        default=300.0,
        gt=0,
        le=86400,
        validation_alias=env_names("monitor_platform_fault_hold_sec"),
        description=(
            "How long a GPU card fault stands after its last event before it is cleared; a later event on the "
            "same card is then a new fault (default 300 s)."
        ),
    )
    platform_lookback_sec: float = Field(
        default=0.0,
        ge=0,
        le=86400,
        validation_alias=env_names("monitor_platform_lookback_sec"),
        description=(
            "At start, also take the events of this many seconds before (default 0: only new events, so that a "
            "restarted controller does not reopen windows for faults it already handled)."
        ),
    )
    platform_source: str = Field(
        default="real",
        pattern="^(real|simulated)$",
        validation_alias=env_names("monitor_platform_source"),
        description="Which cards of the platform to follow: real (default) or simulated.",
    )
    platform_tenant_id: str | None = Field(
        default=None,
        validation_alias=env_names("monitor_platform_tenant_id"),
        description=(
            "The tenant whose nodes' events are evidence for this controller's instances (default unset: only "
            "nodes without a tenant). Events of any other tenant's nodes are skipped and counted, whatever the "
            "monitor's token may read: another tenant's agent never moves these instances."
        ),
    )
    platform_new_fault_interval_sec: float = Field(
        default=10.0,
        ge=0,
        le=3600,
        validation_alias=env_names("monitor_platform_new_fault_interval_sec"),
        description=(
            "Shortest time between two polls that raise new card faults (default 10 s): new faults of one poll "
            "are raised together, later ones wait (counted, reported as a problem) until the interval has "
            "passed, so that a storm of events causes at most one reconfiguration per interval. 0: no limit."
        ),
    )
