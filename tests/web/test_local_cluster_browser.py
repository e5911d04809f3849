"""The serving dashboard on the local cluster, as ``heteroflow up`` starts it: real processes (platform server,
controller, Coordinator, NodeManagers, simulated engines with torch workers), a Chromium on ``/serving`` signed in
with a read-only ``nodes:read,serving:read`` token, and a rank's worker killed under traffic.

The page must show what the controller does: the instance serving on four ranks, then the scale-down round of
rank 2 in its timeline and its past rounds, committed, and rank 2 committed dead, in English and in Chinese; each
round's trigger, what clients saw and its absolute times; then a hardware fault on rank 1's card, whose fallback
leaves no rank with that standing fault shown alive.
Nothing sleeps for synchronisation: Playwright's expectations and :func:`until` poll with deadlines.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from heteroflow.core.clock import SystemClock
from heteroflow.http.tls import client_tls
from heteroflow.local import ClusterOptions, ClusterState, LocalCluster
from heteroflow.local.faults import KillMode, kill
from heteroflow.local.hardware import inject as inject_hardware
from heteroflow.platform.auth import parse_scopes
from heteroflow.storage.db import create_db_engine
from heteroflow.storage.token_store import SqlTokenStore
from tests.acceptance.harness import COLLECTIVE_TIMEOUT_SEC, TIMINGS, traffic
from tests.support.polling import until
from tests.web.session import sign_in

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.timeout(420)]

INSTANCE = '.instance[data-instance="inst-1"]'
DURATION = re.compile(r"^\d+\.\d{3} s$")
"""A duration as the page writes it: "1.234 s"."""
ROUND_WAIT_MS = 120_000
"""A round on a 2-core machine with torch workers takes seconds; the deadline leaves room for a loaded host."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, ClusterState]]:
    pytest.importorskip("torch")
    base = tmp_path_factory.mktemp("web-cluster")
    config = base / "operator.yaml"
    config.write_text(yaml.safe_dump({"fault_tolerance_config": TIMINGS}))
    options = ClusterOptions(
        data_dir=base / "local",
        server_port=0,
        controller_port=0,
        coordinator_port=0,
        controller_config=config,
        collective_timeout_sec=COLLECTIVE_TIMEOUT_SEC,
    )
    local = LocalCluster(options)
    with pytest.MonkeyPatch.context() as env:
        for variable in list(os.environ):  # the processes inherit this environment: nothing from the shell
            if variable.startswith("HETEROFLOW_"):
                env.delenv(variable)
        state = local.start()
    try:
        local.wait_ready(timeout_sec=240)
        yield local, state
    finally:
        report = local.stop()
    assert report.left == (), f"processes left behind: {report.left}"


def serving_reader(state: ClusterState) -> str:
    """A read-only operator's token (no admin), created the way ``heteroflow admin create-token`` does."""
    engine = create_db_engine(state.database_url)
    try:
        store = SqlTokenStore(engine)
        scopes = parse_scopes("nodes:read,serving:read")
        return store.create_token(name="sre", scopes=scopes, tenant_id=None, now=SystemClock().now())[1]
    finally:
        engine.dispose()


def controller_status(state: ClusterState) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {state.cluster_token or state.admin_token}"}
    [entry] = httpx.get(
        f"{state.controller_url}/controller/fault_tolerance/status", headers=headers, verify=client_tls()
    ).json()
    return dict(entry)


def controller_rounds(state: ClusterState, request_id: str | None = None) -> Any:
    headers = {"Authorization": f"Bearer {state.cluster_token or state.admin_token}"}
    path = f"/rounds/{request_id}" if request_id else "/rounds?instance_id=inst-1"
    response = httpx.get(
        f"{state.controller_url}/controller/fault_tolerance{path}", headers=headers, verify=client_tls()
    )
    response.raise_for_status()
    return response.json()


def check_story(instance: Any, state: ClusterState, request_id: str) -> None:
    """The shown round's trigger, client outcome and absolute times are the controller's record's."""
    from playwright.sync_api import expect

    record = until(
        lambda: (r := controller_rounds(state, request_id))["clients"] is not None and r,
        within=30,
        what=f"round {request_id} knows what its clients saw",
    )
    story = instance.locator(f'.timeline-box[data-request="{request_id}"] .round-story')
    if record["trigger"] is not None:
        expect(story.locator(".story-reason")).to_have_attribute("data-reason", record["trigger"]["reason"])
    clients = record["clients"]
    assert clients["error"] is None, clients
    for name in ("held", "rerouted", "resumed", "failed"):
        expect(story.locator(f'.story-clients [data-count="{name}"] dd')).to_have_text(str(clients[name]))
    if clients["longest_wait_sec"] is not None:
        expect(story.locator('.story-clients [data-count="longest_wait_sec"] dd')).to_contain_text(
            f"{clients['longest_wait_sec']:.3f} s"
        )
    for name, at in record["times"].items():
        fact = story.locator(f'.story-times [data-time="{name}"]')
        expect(fact).to_have_attribute("data-at", at or "")
        if at:
            expect(fact.locator("dd")).to_contain_text("UTC")
    assert record["times"]["decided_at"], record["times"]
    assert record["times"]["serving_resumed_at"], record["times"]


def test_the_dashboard_follows_a_real_round_on_the_local_cluster(
    browser: Any, cluster: tuple[LocalCluster, ClusterState], tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    local, state = cluster
    token = serving_reader(state)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    try:
        sign_in(context, state.server_url, token)
        context.add_init_script(
            "if (!sessionStorage.getItem('seeded')) {"
            " localStorage.setItem('heteroflow.lang', 'en'); sessionStorage.setItem('seeded', '1'); }"
        )
        page = context.new_page()
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(state.server_url + "/serving")
        instance = page.locator(INSTANCE)
        # before the fault: no "no controller configured", four alive ranks, serving
        expect(page.locator("#serving-error")).to_have_count(0)
        expect(instance).to_have_attribute("data-phase", "NORMAL", timeout=30_000)
        expect(instance.locator(".rank-grid li")).to_have_count(4)
        expect(instance.locator('.rank-grid li[data-state="alive"]')).to_have_count(4)
        expect(instance.locator(".badge.can-serve")).to_have_text("Can serve")
        expect(instance.locator("table.pods tr[data-pod] .pod-node a")).to_have_count(2)

        inst = state.instance("inst-1")
        with traffic(state) as _load, local.client(timeout_sec=30) as client:
            said = kill(client, inst, 2, mode=KillMode.WORKER)
            assert "rank 2" in said
            # the round appears on the page (its timeline and a past-rounds row), then commits
            expect(instance.locator(".rank-grid li[data-rank='2']")).to_have_attribute(
                "data-state", "committed_dead", timeout=ROUND_WAIT_MS
            )
            expect(instance).to_have_attribute("data-phase", "SCALED_DOWN_RUNNING", timeout=ROUND_WAIT_MS)
        entry = until(
            lambda: (e := controller_status(state))["dead_committed"] == [2] and e["can_serve"] and e,
            within=60,
            what="the controller's own status: rank 2 committed",
        )
        request_id = entry["request_id"]
        row = instance.locator(f'table.rounds tr[data-request="{request_id}"]')
        expect(row).to_have_attribute("data-outcome", "committed", timeout=30_000)
        expect(row.locator(".duration")).to_have_text(DURATION)
        timeline = instance.locator(f'ol.timeline[data-request="{request_id}"]')
        expect(timeline.locator('li[data-kind="decided"]')).to_contain_text("Decided: remove 2")
        expect(timeline.locator('li[data-kind="outcome"]')).to_contain_text("Outcome: committed")
        for rank in (0, 1, 3):
            expect(instance.locator(f".rank-grid li[data-rank='{rank}']")).to_have_attribute("data-state", "alive")
        expect(instance.locator(".rank-grid li[data-rank='2'] .rank-pub")).to_have_text("not published")
        expect(instance.locator(".instance-facts")).to_contain_text("0, 1, 3")
        # the round keeps its story: its trigger, what the clients saw through the Coordinator, absolute times;
        # the committed rank keeps its cause
        check_story(instance, state, request_id)
        expect(instance.locator(".rank-grid li[data-rank='2'] .rank-engine")).to_contain_text("cause: dead")

        # a hardware fault (XID 79, level 6) on rank 1's card: no software evidence follows, the correlation
        # expires and the whole-instance fallback relaunches without the faulted card
        with traffic(state) as _load, local.client(timeout_sec=30) as client:
            said = inject_hardware(client, inst, 1, level=6)
            assert "rank" in said or "MAPPED" in said, said
            fallback = until(
                lambda: next(
                    (r for r in controller_rounds(state) if r["kind"] == "fallback" and r["outcome"] is not None), None
                ),
                within=ROUND_WAIT_MS / 1000,
                what="the hardware fault's fallback finished",
            )
        assert fallback["outcome"] == "succeeded", fallback
        fb_id = fallback["request_id"]
        expect(instance.locator(".timeline-box")).to_have_attribute("data-request", fb_id, timeout=30_000)
        check_story(instance, state, fb_id)
        # one truth about the standing fault: no rank with it is green, nothing says "no hardware fault"
        entry = controller_status(state)
        assert entry["standing_hardware_faults"], entry
        expect(instance.locator(".rank-grid li[data-rank='1']")).not_to_have_attribute("data-state", "alive")
        expect(instance.locator('.rank-grid li[data-state="alive"] .rank-hw')).to_have_count(0)
        expect(instance.locator(".hw-empty")).to_have_count(0)
        expect(instance.locator(".instance-facts [data-round]")).to_have_attribute("data-round", fb_id)
        if entry["last_error"] and entry["can_serve"]:  # an expired correlation that led to a relaunch: history
            expect(instance.locator(".last-error")).to_have_attribute("data-resolved", "true")
            expect(instance.locator(".last-error .error")).to_have_count(0)

        # the same page in Chinese
        page.select_option("#lang", "zh")
        # the relaunch brought rank 2 back; rank 1 stays off its faulted card
        rank_1 = "已提交死亡" if 1 in entry["dead_committed"] else "硬件故障"
        expect(instance.locator(".rank-grid li[data-rank='1'] .rank-state")).to_have_text(rank_1)
        expect(instance.locator(".rank-grid li[data-rank='1'] .rank-id")).to_have_text("DP 副本 1")
        expect(instance.locator("table.pods th").first).to_have_text("容器组")
        expect(instance.locator(".round-story")).to_contain_text("客户端看到了什么")
        expect(instance.locator(".round-story")).to_contain_text("恢复服务")
        page.screenshot(path=str(tmp_path / "serving-local-cluster-zh.png"), full_page=True)
    finally:
        context.close()
    assert not errors, f"uncaught page errors: {errors}"
