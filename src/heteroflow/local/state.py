"""The state file of a local cluster: where everything listens, who runs, and the admin token.

``heteroflow up`` writes it (mode 0600: it holds the admin token) once its processes are started;
``heteroflow fault`` and ``heteroflow status`` read it, and so do tests. It is replaced atomically, so a
reader never sees half a file. The format is documented in ``docs/local-cluster.md``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from heteroflow.contracts.serving import DeviceInfo

STATE_VERSION = 1


class StateFileError(ValueError):
    """The state file is missing or is not a local cluster's state; the text says which."""


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class EndpointState(_Model):
    """One engine (one DP rank) of an instance."""

    id: int = Field(ge=0, description="Original global DP rank: the engine's FT id.")
    ip: str
    port: int
    pod: str = Field(description="The pod (NodeManager) that runs it.")
    device_infos: list[DeviceInfo] = Field(default_factory=list, description="Simulated cards behind the rank.")


class PodState(_Model):
    pod_id: str
    node_manager_url: str
    endpoint_ids: list[int]
    node_name: str = Field(description="Simulated GPU node the pod's cards belong to (hardware faults).")


class InstanceState(_Model):
    instance_id: str
    model: str
    dp_size: int
    endpoints: list[EndpointState]
    pods: list[PodState]

    def endpoint(self, rank: int) -> EndpointState:
        for endpoint in self.endpoints:
            if endpoint.id == rank:
                return endpoint
        raise KeyError(rank)

    def pod(self, pod_id: str) -> PodState:
        for pod in self.pods:
            if pod.pod_id == pod_id:
                return pod
        raise KeyError(pod_id)


class ProcessState(_Model):
    """One process the launcher started; each leads its own session (``pid`` = process group = session)."""

    name: str
    pid: int
    log: str
    command: list[str] = Field(default_factory=list)


class PodNetworkState(_Model):
    """One pod's network namespace (``heteroflow up --netns``)."""

    pod_id: str
    namespace: str = Field(description="Its NodeManager and engines run in it (`ip netns exec <namespace>`).")
    ip: str = Field(description="The pod's IP: its NodeManager's, its engines', the one it registers.")
    veth: str = Field(description="The root namespace's end of its veth pair, on the bridge.")


class NetworkState(_Model):
    """The pods' network when each pod has a namespace of its own; absent from the file otherwise."""

    bridge: str
    subnet: str
    gateway: str = Field(description="The bridge's address: the server, controller and Coordinator listen on it.")
    pods: list[PodNetworkState]

    def pod(self, pod_id: str) -> PodNetworkState:
        for pod in self.pods:
            if pod.pod_id == pod_id:
                return pod
        raise KeyError(pod_id)


class ClusterState(_Model):
    version: int = STATE_VERSION
    cluster_id: str = Field(description="Marker in every process's environment (HETEROFLOW_LOCAL_CLUSTER_ID).")
    launcher_pid: int = Field(description="The `heteroflow up` (or test) process that owns the cluster.")
    data_dir: str
    log_dir: str
    server_url: str
    controller_url: str
    coordinator_url: str
    admin_token: str
    cluster_token: str | None = Field(
        default=None,
        description=(
            "The internal routes' secret (controller, NodeManagers, engines, the Coordinator's management), its "
            "own random value per run: revoking the admin token leaves no way in. Absent in older state files "
            "(the admin token was the cluster token then)."
        ),
    )
    api_key: str | None = Field(
        default=None, description="A platform token with the inference scope: the Coordinator's OpenAI API key."
    )
    agent_token: str | None = Field(
        default=None, description="The simulated agents' token: `heteroflow fault hardware --via gpu-health` uses it."
    )
    hardware_directory: str | None = Field(
        default=None, description="The folder of MindCluster ConfigMap documents the controller follows."
    )
    database_url: str
    controller_config: str = Field(description="The controller YAML actually used (generated + --config).")
    instances: list[InstanceState]
    processes: list[ProcessState]
    network: NetworkState | None = Field(
        default=None, description="Each pod's namespace and IP (`--netns`); absent when every pod is on loopback."
    )

    def instance(self, instance_id: str | None) -> InstanceState:
        """The named instance, or the only one when ``instance_id`` is ``None``."""
        if instance_id is None:
            if len(self.instances) != 1:
                ids = ", ".join(i.instance_id for i in self.instances)
                raise StateFileError(f"the cluster runs several instances ({ids}); name one with --instance")
            return self.instances[0]
        for inst in self.instances:
            if inst.instance_id == instance_id:
                return inst
        ids = ", ".join(i.instance_id for i in self.instances)
        raise StateFileError(f"no instance {instance_id!r} in this cluster (it runs {ids})")


def write_state(path: Path, state: ClusterState) -> None:
    """Write ``state`` atomically with mode 0600 (the admin token is in it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        document = state.model_dump(mode="json", exclude={"network"} if state.network is None else None)
        out.write(json.dumps(document, indent=2) + "\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def read_state(path: Path) -> ClusterState:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise StateFileError(
            f"cannot read the state file {path}: {exc.strerror or exc} (is `heteroflow up` running?)"
        ) from exc
    try:
        return ClusterState.model_validate_json(text)
    except ValidationError as exc:
        raise StateFileError(f"{path} is not a local cluster's state file: {exc.errors()[0]['msg']}") from exc
