"""Offline checks of the Kubernetes manifests under ``deploy/kubernetes``.

Each kustomization is rendered here with the only features the overlays may use (``resources``, JSON-6902
``patches``, ``images``, ``replicas``) and every document is validated against the Kubernetes OpenAPI schemas
of :data:`KUBERNETES_VERSION` in strict mode (an unknown field is an error). The deployment's own rules are
assertions on the rendered documents. Where ``kubectl`` is installed, its built-in kustomize must render the
same documents, which shows that this renderer and ``kubectl apply -k`` agree.
"""

from __future__ import annotations

import copy
import importlib
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import kubernetes_validate
import pytest
import yaml

from heteroflow.core.settings import LenientSettings
from heteroflow.serving.controller.config import load_config
from heteroflow.serving.controller.store import EtcdFtRuntimeStore, open_store
from heteroflow.serving.node_manager.spec import load_spec

Document = dict[str, Any]

DEPLOY = Path(__file__).resolve().parents[3] / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.30.0"
NAMESPACE = "heteroflow"

BASE = "base"
DEV = "overlays/dev"
PRODUCTION = "overlays/production"
EXAMPLE = "examples/serving-instance"
KUSTOMIZATIONS = (BASE, DEV, PRODUCTION, EXAMPLE)
PLATFORM = (BASE, DEV, PRODUCTION)

SUPPORTED_FIELDS = frozenset({"apiVersion", "kind", "resources", "patches", "images", "replicas"})
SCALABLE_KINDS = frozenset({"Deployment", "StatefulSet", "ReplicaSet", "ReplicationController"})
WORKLOAD_KINDS = frozenset({"Deployment", "StatefulSet", "DaemonSet"})
CLUSTER_SCOPED_KINDS = frozenset({"Namespace", "ClusterRole", "ClusterRoleBinding"})
SECRET_LIKE = re.compile(r"TOKEN|PASSWORD|SECRET|API_KEY|DATABASE_URL")

# The controller's active/standby settings (docs/controller.md), which the manifests must set.
CONTROLLER_HA_VARIABLES = frozenset(
    {
        "HETEROFLOW_CONTROLLER_LEADER_ELECTION",
        "HETEROFLOW_CONTROLLER_LEASE_TTL_SEC",
        "HETEROFLOW_CONTROLLER_ID",
        "HETEROFLOW_CONTROLLER_ADVERTISE_URL",
    }
)
SETTINGS_MODULES = (
    "heteroflow.platform_server.settings",
    "heteroflow.platform_server.alert_delivery",
    "heteroflow.health.settings",
    "heteroflow.health.metrics_settings",
    "heteroflow.health.prediction_settings",
    "heteroflow.agent.settings",
    "heteroflow.serving.controller.config",
    "heteroflow.serving.controller.monitor.settings",
    "heteroflow.serving.coordinator.settings",
    "heteroflow.serving.node_manager.settings",
)
# What the downward API gives a container, for expanding $(VAR) references in the checks.
FIELD_SAMPLES = {"status.podIP": "10.0.0.7", "metadata.name": "pod-0", "spec.nodeName": "gpu-node-1"}


# == the renderer ================================================================================================
class RenderError(Exception):
    """A kustomization this renderer cannot render exactly as kustomize would."""


def load_documents(path: Path) -> list[Document]:
    """The non-empty documents of a (multi-document) YAML file."""
    documents = [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc is not None]
    for doc in documents:
        if not isinstance(doc, dict) or not {"apiVersion", "kind", "metadata"} <= doc.keys():
            raise RenderError(f"{path}: every document needs apiVersion, kind and metadata")
    return documents


def render(directory: Path) -> list[Document]:
    """The documents ``kubectl kustomize directory`` prints (in file order, not kustomize's)."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text(encoding="utf-8"))
    unsupported = sorted(set(kustomization) - SUPPORTED_FIELDS)
    if unsupported:
        raise RenderError(f"{directory}: unsupported kustomization fields {unsupported}")
    documents: list[Document] = []
    for entry in kustomization.get("resources", []):
        path = directory / entry
        documents.extend(render(path) if path.is_dir() else load_documents(path))
    seen = [identity(doc) for doc in documents]
    duplicates = sorted({key for key in seen if seen.count(key) > 1})
    if duplicates:
        raise RenderError(f"{directory}: resources defined twice: {duplicates}")
    # kustomize's order: patches, then replicas, then images.
    for patch in kustomization.get("patches", []):
        documents = apply_patch(documents, patch, directory)
    for replicas in kustomization.get("replicas", []):
        set_replicas(documents, replicas)
    for image in kustomization.get("images", []):
        set_image(documents, image)
    return documents


def identity(doc: Document) -> tuple[str, str, str, str]:
    meta = doc["metadata"]
    return (doc["apiVersion"], doc["kind"], meta.get("namespace", ""), meta["name"])


def apply_patch(documents: list[Document], patch: dict[str, Any], directory: Path) -> list[Document]:
    """A JSON-6902 patch (inline ``patch`` or a ``path`` file) applied to its ``target`` (kind and name)."""
    if set(patch) - {"patch", "path", "target"} or ("patch" in patch) == ("path" in patch):
        raise RenderError(f"{directory}: a patch needs a target and exactly one of patch/path: {patch}")
    target = patch.get("target", {})
    if set(target) != {"kind", "name"}:
        raise RenderError(f"{directory}: a patch target is exactly kind and name here: {target}")
    text = patch["patch"] if "patch" in patch else (directory / patch["path"]).read_text(encoding="utf-8")
    operations = yaml.safe_load(text)
    if not isinstance(operations, list) or not all(isinstance(op, dict) and "op" in op for op in operations):
        raise RenderError(f"{directory}: only JSON-6902 patches (a list of operations) are supported: {target}")
    matched = False
    patched: list[Document] = []
    for doc in documents:
        if doc["kind"] == target["kind"] and doc["metadata"]["name"] == target["name"]:
            try:
                doc = jsonpatch.apply_patch(doc, operations)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                raise RenderError(f"{directory}: patch of {target} fails: {exc}") from exc
            matched = True
        patched.append(doc)
    if not matched:
        raise RenderError(f"{directory}: patch target {target} matches nothing")
    return patched


def set_replicas(documents: list[Document], entry: dict[str, Any]) -> None:
    hits = [doc for doc in documents if doc["kind"] in SCALABLE_KINDS and doc["metadata"]["name"] == entry["name"]]
    if not hits:
        raise RenderError(f"replicas: nothing scalable is named {entry['name']!r}")
    for doc in hits:
        doc["spec"]["replicas"] = entry["count"]


def split_image(reference: str) -> tuple[str, str | None, str | None]:
    """``name[:tag][@digest]`` → (name, tag, digest); a registry port is part of the name."""
    name, _, digest = reference.partition("@")
    head, colon, tag = name.rpartition(":")
    if colon and "/" not in tag:
        return head, tag, digest or None
    return name, None, digest or None


def set_image(documents: list[Document], entry: dict[str, Any]) -> None:
    unsupported = set(entry) - {"name", "newName", "newTag", "digest"}
    if unsupported:
        raise RenderError(f"images: unsupported fields {sorted(unsupported)}")
    for container in all_containers(documents):
        name, tag, digest = split_image(container["image"])
        if name != entry["name"]:
            continue
        name = entry.get("newName", name)
        if "digest" in entry:
            container["image"] = f"{name}@{entry['digest']}"
            continue
        tag = str(entry.get("newTag", tag)) if entry.get("newTag", tag) is not None else None
        container["image"] = name + (f":{tag}" if tag else "") + (f"@{digest}" if digest else "")


# == reading the rendered documents ==============================================================================
def rendered(kustomization: str) -> list[Document]:
    return render(DEPLOY / kustomization)


def pod_spec(doc: Document) -> dict[str, Any]:
    spec: dict[str, Any] = doc["spec"]["template"]["spec"]
    return spec


def workloads(documents: list[Document]) -> list[Document]:
    return [doc for doc in documents if doc["kind"] in WORKLOAD_KINDS]


def all_containers(documents: list[Document]) -> Iterator[dict[str, Any]]:
    for doc in workloads(documents):
        spec = pod_spec(doc)
        yield from spec.get("initContainers", [])
        yield from spec["containers"]


def one(documents: list[Document], kind: str, name: str) -> Document:
    hits = [doc for doc in documents if doc["kind"] == kind and doc["metadata"]["name"] == name]
    assert len(hits) == 1, f"expected exactly one {kind}/{name}, found {len(hits)}"
    return hits[0]


def container(doc: Document, name: str) -> dict[str, Any]:
    hits: list[dict[str, Any]] = [c for c in pod_spec(doc)["containers"] if c["name"] == name]
    assert len(hits) == 1, f"{doc['metadata']['name']}: no single container {name!r}"
    return hits[0]


def env(container_: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {entry["name"]: entry for entry in container_.get("env", [])}


def literal_env(container_: dict[str, Any]) -> dict[str, str]:
    """The container's variables as the process sees them: literals, downward-API samples, $(VAR) expanded."""
    values: dict[str, str] = {}
    for entry in container_.get("env", []):
        if "value" in entry:
            values[entry["name"]] = re.sub(r"\$\((\w+)\)", lambda m: values.get(m[1], m[0]), entry["value"])
        elif "fieldRef" in entry.get("valueFrom", {}):
            values[entry["name"]] = FIELD_SAMPLES[entry["valueFrom"]["fieldRef"]["fieldPath"]]
    return values


def secret_ref(entry: dict[str, Any]) -> dict[str, Any] | None:
    ref: dict[str, Any] | None = entry.get("valueFrom", {}).get("secretKeyRef")
    return ref


def schema_errors(doc: Document) -> list[str]:
    """What strict validation against the Kubernetes schemas finds wrong with one document (empty when valid)."""
    where = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
    try:
        kubernetes_validate.validate(copy.deepcopy(doc), KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{where}: {'.'.join(map(str, exc.path)) or '(root)'}: {exc.message}"]
    except kubernetes_validate.SchemaNotFoundError as exc:
        return [f"{where}: {exc.message}"]
    return []


def port_sources(policy: Document, port: int) -> set[str] | None:
    """Components whose pods may reach ``port`` under ``policy``; ``None`` means anyone."""
    sources: set[str] = set()
    for rule in policy["spec"].get("ingress", []):
        ports = rule.get("ports")
        if ports is not None and not any(p["port"] <= port <= p.get("endPort", p["port"]) for p in ports):
            continue
        if "from" not in rule:
            return None
        for peer in rule["from"]:
            if set(peer) != {"podSelector"}:
                return None  # another namespace or an address block: wider than a component
            sources.add(peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"])
    return sources


def policy_for(documents: list[Document], component: str) -> Document:
    hits = [
        doc
        for doc in documents
        if doc["kind"] == "NetworkPolicy"
        and doc["spec"]["podSelector"].get("matchLabels", {}).get("app.kubernetes.io/component") == component
    ]
    assert len(hits) == 1, f"expected one NetworkPolicy for the {component} pods, found {len(hits)}"
    return hits[0]


def settings_groups() -> list[type[LenientSettings]]:
    """The settings groups of the modules in :data:`SETTINGS_MODULES`."""
    for module in SETTINGS_MODULES:
        importlib.import_module(module)
    groups: list[type[LenientSettings]] = []
    pending: list[type[LenientSettings]] = [LenientSettings]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls.__module__ in SETTINGS_MODULES:
            groups.append(cls)
    return groups


def known_variables() -> set[str]:
    """Every environment name a HeteroFlow settings group reads."""
    names: set[str] = set()
    for group in settings_groups():
        for field in group.model_fields.values():
            choices = getattr(field.validation_alias, "choices", [field.validation_alias])
            names.update(choice for choice in choices if isinstance(choice, str) and choice.isupper())
    return names


# == the renderer itself =========================================================================================
def test_a_broken_document_is_rejected() -> None:
    deployment = one(rendered(BASE), "Deployment", "heteroflow-server")
    assert schema_errors(deployment) == []

    wrong_type = copy.deepcopy(deployment)
    wrong_type["spec"]["replicas"] = "two"
    assert schema_errors(wrong_type) == [
        "Deployment/heteroflow-server: spec.replicas: 'two' is not of type 'integer', 'null'"
    ]
    unknown_field = copy.deepcopy(deployment)
    pod_spec(unknown_field)["containers"][0]["resource"] = {"limits": {"cpu": "1"}}
    assert "'resource' was unexpected" in schema_errors(unknown_field)[0]
    unknown_kind = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    assert "Couldn't find schema for kind Widget" in schema_errors(unknown_kind)[0]


def test_the_renderer_refuses_what_it_cannot_render_like_kustomize(tmp_path: Path) -> None:
    (tmp_path / "cm.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata: {k: v}\n")
    kustomization = tmp_path / "kustomization.yaml"

    kustomization.write_text("resources: [cm.yaml]\npatchesStrategicMerge: [p.yaml]\n")
    with pytest.raises(RenderError, match="unsupported kustomization fields"):
        render(tmp_path)
    kustomization.write_text(
        "resources: [cm.yaml]\npatches:\n  - target: {kind: ConfigMap, name: b}\n"
        "    patch: '[{op: replace, path: /data/k, value: w}]'\n"
    )
    with pytest.raises(RenderError, match="matches nothing"):
        render(tmp_path)
    kustomization.write_text(
        "resources: [cm.yaml]\npatches:\n  - target: {kind: ConfigMap, name: a}\n"
        "    patch: '[{op: test, path: /data/k, value: x}, {op: replace, path: /data/k, value: w}]'\n"
    )
    with pytest.raises(RenderError, match="fails"):
        render(tmp_path)
    kustomization.write_text(
        "resources: [cm.yaml]\npatches:\n  - target: {kind: ConfigMap, name: a}\n"
        "    patch: '[{op: replace, path: /data/k, value: w}]'\n"
    )
    assert render(tmp_path)[0]["data"] == {"k": "w"}


@pytest.mark.parametrize(
    ("reference", "parts"),
    [
        ("heteroflow", ("heteroflow", None, None)),
        ("heteroflow:0.1.0", ("heteroflow", "0.1.0", None)),
        ("localhost:5000/heteroflow", ("localhost:5000/heteroflow", None, None)),
        ("r.io:443/h:1@sha256:ab", ("r.io:443/h", "1", "sha256:ab")),
    ],
)
def test_image_references_split_like_kustomize(reference: str, parts: tuple[str, str | None, str | None]) -> None:
    assert split_image(reference) == parts


# == schemas and layout ==========================================================================================
@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_rendered_document_is_valid(kustomization: str) -> None:
    documents = rendered(kustomization)
    assert documents
    assert [error for doc in documents for error in schema_errors(doc)] == []


def test_every_base_file_is_listed_and_valid_on_its_own() -> None:
    listed = set(yaml.safe_load((DEPLOY / BASE / "kustomization.yaml").read_text())["resources"])
    files = {path.name for path in (DEPLOY / BASE).glob("*.yaml")} - {"kustomization.yaml"}
    assert files == listed
    for name in sorted(files):
        assert [error for doc in load_documents(DEPLOY / BASE / name) for error in schema_errors(doc)] == []


def test_the_secret_example_is_valid_and_never_applied() -> None:
    example = DEPLOY / "secret.example.yaml"
    secrets = load_documents(example)
    assert {doc["kind"] for doc in secrets} == {"Secret"}
    assert [error for doc in secrets for error in schema_errors(doc)] == []
    for kustomization in DEPLOY.rglob("kustomization.yaml"):
        assert "secret.example" not in kustomization.read_text(), kustomization


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_object_names_its_namespace(kustomization: str) -> None:
    for doc in rendered(kustomization):
        namespace = doc["metadata"].get("namespace")
        if doc["kind"] in CLUSTER_SCOPED_KINDS:
            assert namespace is None, identity(doc)
        elif doc["kind"] in ("Role", "RoleBinding") and namespace == "kube-system":
            assert doc["metadata"]["name"].startswith("heteroflow-"), identity(doc)
        else:
            assert namespace == NAMESPACE, identity(doc)


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_labels_are_consistent(kustomization: str) -> None:
    for doc in rendered(kustomization):
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "heteroflow", identity(doc)
    for doc in workloads(rendered(kustomization)):
        labels = doc["spec"]["template"]["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "heteroflow"
        assert labels["app.kubernetes.io/part-of"] == "heteroflow"
        assert labels["app.kubernetes.io/component"] == doc["metadata"]["labels"]["app.kubernetes.io/component"]
        assert doc["spec"]["selector"]["matchLabels"].items() <= labels.items(), identity(doc)


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_service_selects_pods_of_a_workload(kustomization: str) -> None:
    documents = rendered(kustomization)
    for service in (doc for doc in documents if doc["kind"] == "Service"):
        selector = service["spec"]["selector"]
        targets = [
            doc
            for doc in workloads(documents)
            if doc["metadata"]["namespace"] == service["metadata"]["namespace"]
            and selector.items() <= doc["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert targets, f"Service {service['metadata']['name']} selects no workload's pods"
        named_ports = {port["name"] for doc in targets for c in pod_spec(doc)["containers"] for port in c["ports"]}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in named_ports, (service["metadata"]["name"], port)


# == containers ==================================================================================================
@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_container_has_requests_and_limits(kustomization: str) -> None:
    for container_ in all_containers(rendered(kustomization)):
        resources = container_["resources"]
        for bound in ("requests", "limits"):
            assert {"cpu", "memory"} <= resources[bound].keys(), (container_["name"], bound)


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_pods_run_unprivileged(kustomization: str) -> None:
    for doc in workloads(rendered(kustomization)):
        spec = pod_spec(doc)
        assert spec["securityContext"]["runAsNonRoot"] is True, identity(doc)
        assert spec["securityContext"]["runAsUser"] != 0, identity(doc)
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, identity(doc)
        # Service links would set HETEROFLOW_<SERVICE>_PORT=tcp://…, the name of a HeteroFlow setting.
        assert spec["enableServiceLinks"] is False, identity(doc)
        assert not spec.get("hostNetwork"), identity(doc)
        assert not spec.get("hostPID"), identity(doc)
        assert all("hostPath" not in volume for volume in spec.get("volumes", [])), identity(doc)
        for container_ in spec["containers"]:
            context = container_["securityContext"]
            assert context["allowPrivilegeEscalation"] is False, container_["name"]
            assert context["readOnlyRootFilesystem"] is True, container_["name"]
            assert context["capabilities"]["drop"] == ["ALL"], container_["name"]
            assert not context.get("privileged"), container_["name"]
            mounts = {mount["mountPath"] for mount in container_.get("volumeMounts", [])}
            assert "/tmp" in mounts, f"{container_['name']}: /tmp must be a writable volume"


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_no_secret_value_is_shipped(kustomization: str) -> None:
    documents = rendered(kustomization)
    assert [doc["metadata"]["name"] for doc in documents if doc["kind"] == "Secret"] == []
    for container_ in all_containers(documents):
        for name, entry in env(container_).items():
            if SECRET_LIKE.search(name):
                assert "value" not in entry, f"{name} must come from a Secret"
                assert secret_ref(entry) is not None, f"{name} must come from a Secret"


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_variable_is_a_setting_and_its_value_is_accepted(
    kustomization: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    known = known_variables()
    for container_ in all_containers(rendered(kustomization)):
        ours = {name for name in env(container_) if name.startswith("HETEROFLOW_")}
        assert ours <= known, f"{container_['name']}: unknown variables {sorted(ours - known)}"

        for name in [name for name in os.environ if name.upper().startswith("HETEROFLOW_")]:
            monkeypatch.delenv(name)
        for name, value in literal_env(container_).items():
            if name.startswith("HETEROFLOW_"):
                monkeypatch.setenv(name, value)
        for group in settings_groups():
            assert group.load().config_warnings == (), (container_["name"], group.__name__)


# == the components ==============================================================================================
@pytest.mark.parametrize(("kustomization", "replicas"), [(BASE, 2), (DEV, 1), (PRODUCTION, 3)])
def test_server_is_replicated_probed_and_reads_the_database_url_from_a_secret(
    kustomization: str, replicas: int
) -> None:
    from fastapi.routing import APIRoute

    from heteroflow.platform_server.routes import ops

    server = one(rendered(kustomization), "Deployment", "heteroflow-server")
    assert server["spec"]["replicas"] == replicas
    if kustomization != DEV:
        assert server["spec"]["replicas"] >= 2
    main = container(server, "server")
    variables = env(main)
    assert secret_ref(variables["HETEROFLOW_DATABASE_URL"]) == {"name": "heteroflow-database", "key": "url"}
    assert variables["HETEROFLOW_SERVER_HOST"]["value"] == "0.0.0.0"
    health = next(route for route in ops.router.routes if isinstance(route, APIRoute) and route.path == "/health")
    assert not health.dependant.dependencies  # open: a probe carries no token
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert main[probe]["httpGet"]["path"] == "/health", probe


@pytest.mark.parametrize("kustomization", PLATFORM)
def test_the_server_reaches_the_controller_for_the_serving_dashboard(kustomization: str) -> None:
    """The serving dashboard's proxy: the controller's Service URL and the cluster token the controller checks."""
    from urllib.parse import urlsplit

    documents = rendered(kustomization)
    server = env(container(one(documents, "Deployment", "heteroflow-server"), "server"))
    controller = env(container(one(documents, "Deployment", "heteroflow-controller"), "controller"))
    url = urlsplit(server["HETEROFLOW_SERVER_CONTROLLER_URL"]["value"])
    service = one(documents, "Service", url.hostname or "")
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "controller"
    assert url.port in {port["port"] for port in service["spec"]["ports"]}
    token = secret_ref(server["HETEROFLOW_CLUSTER_TOKEN"])
    assert token is not None
    assert token == secret_ref(controller["HETEROFLOW_CLUSTER_TOKEN"])


@pytest.mark.parametrize("kustomization", [BASE, DEV, PRODUCTION])
def test_the_controller_publishes_to_the_coordinators_management_listener(kustomization: str) -> None:
    """DEL/ADD/SET go to the port the Coordinator serves from a thread and loop of their own, not to the OpenAI
    listener's busy loop."""
    from urllib.parse import urlsplit

    documents = rendered(kustomization)
    controller = env(container(one(documents, "Deployment", "heteroflow-controller"), "controller"))
    coordinator = container(one(documents, "Deployment", "heteroflow-coordinator"), "coordinator")
    url = urlsplit(controller["HETEROFLOW_CONTROLLER_COORDINATOR_URL"]["value"])
    service = one(documents, "Service", url.hostname or "")
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "coordinator"
    (target,) = [port["targetPort"] for port in service["spec"]["ports"] if port["port"] == url.port]
    (served,) = [port["containerPort"] for port in coordinator["ports"] if port["name"] == target]
    assert str(served) == env(coordinator)["HETEROFLOW_COORDINATOR_MANAGEMENT_PORT"]["value"]


@pytest.mark.parametrize(("kustomization", "replicas"), [(BASE, 2), (DEV, 1), (PRODUCTION, 2)])
def test_controller_runs_active_standby(kustomization: str, replicas: int) -> None:
    controller = one(rendered(kustomization), "Deployment", "heteroflow-controller")
    assert controller["spec"]["replicas"] == replicas
    # A standby is never ready; a rollout that waited for a ready replacement would never finish.
    assert controller["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == "100%"
    main = container(controller, "controller")
    assert main["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert main["livenessProbe"]["httpGet"]["path"] == "/health"
    variables = env(main)
    assert variables.keys() >= CONTROLLER_HA_VARIABLES
    assert variables["HETEROFLOW_CONTROLLER_LEADER_ELECTION"]["value"] == "true"
    assert variables["HETEROFLOW_CONTROLLER_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    names = [entry["name"] for entry in main["env"]]
    assert names.index("POD_IP") < names.index("HETEROFLOW_CONTROLLER_ADVERTISE_URL")  # $(POD_IP) needs it first
    assert literal_env(main)["HETEROFLOW_CONTROLLER_ADVERTISE_URL"] == "http://10.0.0.7:8500"
    store = open_store(variables["HETEROFLOW_CONTROLLER_STORE_URL"]["value"], timeout_sec=1.0)
    assert isinstance(store, EtcdFtRuntimeStore)
    assert secret_ref(variables["HETEROFLOW_CLUSTER_TOKEN"]) is not None
    # A disruption budget would count the standby as unavailable and block every eviction of the leader.
    budgets = [doc for doc in rendered(kustomization) if doc["kind"] == "PodDisruptionBudget"]
    labels = controller["spec"]["template"]["metadata"]["labels"]
    assert not [doc for doc in budgets if doc["spec"]["selector"]["matchLabels"].items() <= labels.items()]


def test_controller_configuration_file_loads_without_warnings(tmp_path: Path) -> None:
    config_map = one(rendered(BASE), "ConfigMap", "heteroflow-controller")
    controller = one(rendered(BASE), "Deployment", "heteroflow-controller")
    args = container(controller, "controller")["args"]
    path = Path(args[args.index("--config") + 1])
    (tmp_path / path.name).write_text(config_map["data"][path.name])
    assert load_config(tmp_path / path.name, environ={}).warnings == ()


def test_controller_reads_device_info_config_maps_and_nodes_and_may_only_delete_serving_pods() -> None:
    documents = rendered(BASE)
    account = pod_spec(one(documents, "Deployment", "heteroflow-controller"))["serviceAccountName"]
    subject = {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
    grants: set[tuple[str, str | None, frozenset[str]]] = set()
    for binding in (doc for doc in documents if doc["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        if subject not in binding["subjects"]:
            continue
        role = one(documents, binding["roleRef"]["kind"], binding["roleRef"]["name"])
        for rule in role["rules"]:
            verbs = frozenset(rule["verbs"])
            grants.update((resource, role["metadata"].get("namespace"), verbs) for resource in rule["resources"])
    read = frozenset({"get", "list", "watch"})
    # the one write: a pod on a card with a standing hardware fault is deleted for replacement, in its namespace
    assert grants == {
        ("configmaps", "kube-system", read),
        ("nodes", None, read),
        ("pods", NAMESPACE, frozenset({"delete"})),
    }
    variables = env(container(one(documents, "Deployment", "heteroflow-controller"), "controller"))
    assert variables["HETEROFLOW_CONTROLLER_POD_REPLACEMENT_NAMESPACE"]["value"] == NAMESPACE


def test_agent_runs_on_every_gpu_node_with_nvml() -> None:
    agent = one(rendered(BASE), "DaemonSet", "heteroflow-agent")
    spec = pod_spec(agent)
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["runtimeClassName"] == "nvidia"
    main = container(agent, "agent")
    assert main["args"] == ["agent", "run"]
    variables = env(main)
    assert variables["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert variables["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    assert secret_ref(variables["HETEROFLOW_AGENT_TOKEN"]) is not None
    assert variables["HETEROFLOW_AGENT_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert "nvidia.com/gpu" not in main["resources"]["limits"], "the agent must not take a GPU from workloads"


def test_every_component_uses_the_one_image() -> None:
    for kustomization, image in ((BASE, "heteroflow:0.1.0"), (PRODUCTION, "registry.example.com/heteroflow:0.1.0")):
        assert {c["image"] for c in all_containers(rendered(kustomization))} == {image}


def test_the_example_instance_runs_node_managers_on_gpus(tmp_path: Path) -> None:
    documents = rendered(EXAMPLE)
    engines = one(documents, "StatefulSet", "heteroflow-engine-decode-0")
    main = container(engines, "node-manager")
    assert main["args"][0] == "node-manager"
    controller_url = main["args"][main["args"].index("--controller") + 1]
    service = one(rendered(BASE), "Service", "heteroflow-controller")
    assert controller_url == f"http://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"
    gpus = main["resources"]["limits"]["nvidia.com/gpu"]
    assert main["resources"]["requests"]["nvidia.com/gpu"] == gpus

    specs = one(documents, "ConfigMap", "heteroflow-engine-decode-0")["data"]
    pods = [f"{engines['metadata']['name']}-{ordinal}" for ordinal in range(engines["spec"]["replicas"])]
    assert sorted(specs) == [f"{pod}.json" for pod in pods]
    ranks: list[int] = []
    for pod in pods:
        (tmp_path / f"{pod}.json").write_text(specs[f"{pod}.json"])
        spec = load_spec(tmp_path / f"{pod}.json")
        assert len(spec.endpoints) == int(gpus)
        assert all(8000 <= endpoint.port <= 8099 for endpoint in spec.endpoints), "the NetworkPolicy's range"
        ranks.extend(sorted(spec.endpoint_ids))
    assert ranks == list(range(spec.dp_size))


# == network policies ============================================================================================
def test_network_policies_keep_internal_routes_internal() -> None:
    documents = rendered(BASE)
    deny = one(documents, "NetworkPolicy", "heteroflow-default-deny-ingress")
    assert deny["spec"]["podSelector"] == {"matchLabels": {"app.kubernetes.io/part-of": "heteroflow"}}
    assert deny["spec"]["policyTypes"] == ["Ingress"]
    assert "ingress" not in deny["spec"]

    assert port_sources(policy_for(documents, "controller"), 8500) == {"node-manager", "server"}
    node_manager = policy_for(documents, "node-manager")
    assert port_sources(node_manager, 8300) == {"controller"}
    assert port_sources(node_manager, 8000) == {"coordinator", "node-manager"}
    assert port_sources(policy_for(documents, "coordinator"), 8400) is None
    assert port_sources(policy_for(documents, "coordinator"), 8401) == {"controller"}
    assert port_sources(policy_for(documents, "server"), 8080) is None


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_served_port_is_covered_by_a_policy(kustomization: str) -> None:
    documents = rendered(BASE) + (rendered(EXAMPLE) if kustomization == EXAMPLE else [])
    for doc in workloads(rendered(kustomization)):
        component = doc["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
        for container_ in pod_spec(doc)["containers"]:
            for port in container_.get("ports", []):
                assert port_sources(policy_for(documents, component), port["containerPort"]) != set()


# == kustomize itself ============================================================================================
@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed: kustomize cross-check skipped")
@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_kubectl_kustomize_renders_the_same_documents(kustomization: str) -> None:
    kubectl = shutil.which("kubectl")
    assert kubectl is not None
    result = subprocess.run(
        [kubectl, "kustomize", str(DEPLOY / kustomization)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    theirs = {identity(doc): doc for doc in yaml.safe_load_all(result.stdout) if doc}
    ours = {identity(doc): doc for doc in rendered(kustomization)}
    assert sorted(theirs) == sorted(ours)
    for key, doc in ours.items():
        assert theirs[key] == doc, key
