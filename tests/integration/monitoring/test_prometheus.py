"""The real monitoring stack against the local cluster's real processes (platform server, controller, Coordinator,
two NodeManagers with simulated engines, simulated agents):

- every service's ``/metrics``, fetched with its own credential, passes ``promtool check metrics``;
- a real Prometheus scrapes all of them with their tokens (a wrong token reads as a target down: 401), loads the
  shipped alerting rules, and its queries see each service's series;
- every metric the rules and the Grafana dashboard query exists in what was scraped, and every dashboard query
  is valid PromQL for that Prometheus.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from heteroflow.core.clock import SystemClock
from heteroflow.http.tls import client_tls
from heteroflow.local import ClusterOptions, ClusterState, LocalCluster
from heteroflow.platform.auth import parse_scopes
from heteroflow.storage.db import create_db_engine
from heteroflow.storage.token_store import SqlTokenStore
from tests.support.monitoring import DASHBOARD, RULES, Prometheus, ScrapeJob, binary, prometheus, promtool
from tests.support.polling import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterState]:
    pytest.importorskip("torch")
    for name in ("promtool", "prometheus"):
        binary(name)  # skip (fail under CI) before starting a cluster for nothing
    base = tmp_path_factory.mktemp("monitoring-cluster")
    options = ClusterOptions(data_dir=base / "local", server_port=0, controller_port=0, coordinator_port=0)
    local = LocalCluster(options)
    with pytest.MonkeyPatch.context() as env:
        for variable in list(os.environ):
            if variable.startswith("HETEROFLOW_"):
                env.delenv(variable)
        state = local.start()
    try:
        local.wait_ready(timeout_sec=240)
        yield state
    finally:
        report = local.stop()
    assert report.left == (), f"processes left behind: {report.left}"


def metrics_token(state: ClusterState) -> str:
    """What a Prometheus is given for the platform server: ``metrics:read``, no tenant, nothing else."""
    engine = create_db_engine(state.database_url)
    try:
        store = SqlTokenStore(engine)
        now = SystemClock().now()
        return store.create_token(name="prometheus", scopes=parse_scopes("metrics:read"), tenant_id=None, now=now)[1]
    finally:
        engine.dispose()


def address(url: str) -> str:
    return urlsplit(url).netloc


def jobs_of(state: ClusterState, token: str) -> list[ScrapeJob]:
    """The four kinds of service, each with the credential its /metrics takes (the cluster token for the
    serving plane: the local cluster's own secret, not the admin token)."""
    node_managers = tuple(address(pod.node_manager_url) for inst in state.instances for pod in inst.pods)
    cluster = state.cluster_token or state.admin_token
    return [
        ScrapeJob("heteroflow-server", (address(state.server_url),), token),
        ScrapeJob("heteroflow-controller", (address(state.controller_url),), cluster),
        ScrapeJob("heteroflow-coordinator", (address(state.coordinator_url),), cluster),
        ScrapeJob("heteroflow-node-manager", node_managers, cluster),
    ]


def test_every_service_metrics_pass_promtool(cluster: ClusterState) -> None:
    token = metrics_token(cluster)
    for job in jobs_of(cluster, token):
        for target in job.targets:
            response = httpx.get(
                f"http://{target}/metrics",
                headers={"Authorization": f"Bearer {job.token}"},
                timeout=10,
                verify=client_tls(),
            )
            assert response.status_code == 200, (job.name, response.text[:300])
            assert response.headers["content-type"].startswith("text/plain")
            checked = promtool("check", "metrics", stdin=response.content)
            assert checked.returncode == 0, f"{job.name} {target}: {checked.stdout}{checked.stderr}"
            assert "heteroflow_" in response.text


def test_a_real_prometheus_scrapes_every_service_with_its_token(cluster: ClusterState, tmp_path: Path) -> None:
    token = metrics_token(cluster)
    jobs = jobs_of(cluster, token)
    wrong = ScrapeJob("heteroflow-server-wrong-token", (address(cluster.server_url),), "hf_not-a-token")
    with prometheus(tmp_path / "prometheus", [*jobs, wrong], rule_files=(RULES,)) as prom:
        targets = until(lambda: scraped(prom, expected=6), within=60, what="every target scraped once")
        health = {(t["labels"]["job"], t["labels"]["instance"]): t["health"] for t in targets}
        assert health == {
            **{(job.name, target): "up" for job in jobs for target in job.targets},
            (wrong.name, wrong.targets[0]): "down",
        }, targets
        [refused] = [t for t in targets if t["labels"]["job"] == wrong.name]
        assert "401" in refused["lastError"]

        # each service's own series, as Prometheus stored them
        assert value(prom, 'heteroflow_controller_acting{job="heteroflow-controller"}') == 1
        assert value(prom, 'heteroflow_controller_ft_phase{instance_id="inst-1", phase="NORMAL"}') == 1
        assert value(prom, 'heteroflow_controller_intervention_required{instance_id="inst-1"}') == 0
        assert value(prom, 'heteroflow_controller_relaunch_refused{instance_id="inst-1"}') == 0
        # the Coordinator's own ``instance`` label collides with the target's: Prometheus keeps it as
        # ``exported_instance`` (docs/operations.md says so)
        assert value(prom, 'heteroflow_coordinator_published_endpoints{exported_instance="inst-1"}') == 4
        assert value(prom, 'sum(heteroflow_node_manager_engine_ready{job="heteroflow-node-manager"})') == 4
        assert value(prom, 'heteroflow_fleet_scrape_ok{job="heteroflow-server"}') == 1
        until(lambda: value(prom, 'sum(heteroflow_heartbeats_total{job="heteroflow-server"})'), within=30, what="beats")
        assert value(prom, 'sum(heteroflow_alerts_open{type="GPU_FAULT_PREDICTED"})') == 0  # counted: 0, present

        # the shipped rules are loaded and evaluate without error
        groups = until(lambda: evaluated(prom), within=30, what="every rule evaluated")
        assert {g["name"] for g in groups} == {
            "heteroflow-gpu-health",
            "heteroflow-serving",
            "heteroflow-targets",
            "heteroflow-agent-tools",
        }

        def quiet() -> set[str] | None:
            # a rule evaluated before a target's first scrape (absent()) is pending until its next evaluation
            active = {r["name"] for g in prom.rule_groups() for r in g["rules"] if r["state"] != "inactive"}
            return None if active - {"HeteroflowTargetDown"} else active | {"quiet"}

        # only the deliberately wrong token's target may be down; nothing of the healthy cluster fires
        until(quiet, within=60, what="no rule of the healthy cluster active")

        names = prom.metric_names()
        rules = [r["expr"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
        assert metric_names(rules) <= names, metric_names(rules) - names

        dashboard = json.loads(DASHBOARD.read_text())
        exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
        assert exprs
        for expr in exprs:
            concrete = expr.replace("$node", ".*").replace("$gpu", ".*")
            answer = prom.query(concrete)
            assert answer["status"] == "success", (expr, answer)
        assert metric_names(exprs) <= names, metric_names(exprs) - names
        for variable in dashboard["templating"]["list"]:
            query = variable.get("query")
            text = query if isinstance(query, str) else (query or {}).get("query", "")
            assert metric_names([text]) <= names, (variable["name"], text)


def scraped(prom: Prometheus, *, expected: int) -> list[dict[str, Any]] | None:
    targets = prom.targets()
    if len(targets) != expected or any(t["health"] == "unknown" for t in targets):
        return None
    return targets


def evaluated(prom: Prometheus) -> list[dict[str, Any]] | None:
    groups = prom.rule_groups()
    rules = [r for g in groups for r in g["rules"]]
    if not rules or any(r.get("lastEvaluation", "").startswith("0001") for r in rules):
        return None
    assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]
    return groups


def value(prom: Prometheus, expr: str) -> float | None:
    result = prom.vector(expr)
    if len(result) != 1:
        return None
    return float(result[0]["value"][1])


def metric_names(exprs: list[str]) -> set[str]:
    """The HeteroFlow metric names a list of PromQL expressions reads (label matchers and ranges left out)."""
    names: set[str] = set()
    for expr in exprs:
        stripped = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", expr)
        names |= {word for word in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", stripped) if word.startswith("heteroflow_")}
    return names
