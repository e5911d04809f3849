"""The evidence every acceptance row saves (``serving-ft.md``: "each test saves …"), one folder per scenario.

What goes in a folder (``docs/acceptance.md`` lists the files): the injection commands and target ranks, the
controller's status and the engines' states sampled every :data:`POLL_PERIOD_SEC` for the whole scenario, every
round timeline the controller kept for the scenario (apply bodies with their HTTP codes, finalize, DEL/ADD, pod
stops), ``dead_committed`` before and after, the Coordinator's endpoint sets before and after, and the
completions answered after recovery. A scenario's files are written even when its test fails, so a failure can
be read from them.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from heteroflow.contracts.serving import COORDINATOR_INSTANCES_PATH
from heteroflow.local.client import ClusterClient, ClusterUnreachableError
from heteroflow.local.view import engine_state
from tests.acceptance.harness import INSTANCE, PROMPTS, ClusterUnderTest, events, now_iso, write_json

POLL_PERIOD_SEC = 0.2
"""How often a scenario samples the controller's status, the engines' states and the Coordinator's view."""

_STATUS_KEYS = (
    "phase",
    "request_id",
    "dead_committed",
    "pending_removed_ranks",
    "alive_dp_ranks",
    "engine_statuses",
    "published_endpoints",
    "serving_published",
    "can_serve",
    "running_strategy",
    "last_decision",
    "last_error",
    "fallback_strategy",
    "gate",
    "generation",
    "rounds",
)


def scenario(cut: ClusterUnderTest, folder: str) -> Scenario:
    """The evidence folder ``folder`` of one row, under the suite's evidence root."""
    return Scenario(cut, cut.evidence_root / folder)


# == one scenario's evidence =====================================================================================
class _Sampler:
    """Samples the controller's status, the NodeManagers' view of every engine and the Coordinator's published
    set every :data:`POLL_PERIOD_SEC` in a thread, until stopped. Errors are samples too (a controller that is
    down is part of A17's story)."""

    def __init__(self, cut: ClusterUnderTest) -> None:
        self._cut = cut
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="evidence-sampler", daemon=True)
        self.controller: list[dict[str, Any]] = []
        self.engines: list[dict[str, Any]] = []
        self.started = time.monotonic()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        with self._cut.client(timeout_sec=2) as client:
            while not self._stop.is_set():
                try:
                    self._sample(client)
                except Exception as exc:  # the sampler must never die silently mid-scenario; record why
                    self.controller.append({"t": self._t(), "at": now_iso(), "sampler_error": repr(exc)})
                self._stop.wait(POLL_PERIOD_SEC)  # the sampling period

    def _t(self) -> float:
        return round(time.monotonic() - self.started, 3)

    def _sample(self, client: ClusterClient) -> None:
        t, at = self._t(), now_iso()
        controller: dict[str, Any] = {"t": t, "at": at}
        try:
            entry = client.instance_status(INSTANCE)
            if entry is None:
                controller["error"] = "the controller knows no such instance (yet)"
            else:
                controller.update({key: entry.get(key) for key in _STATUS_KEYS})
        except ClusterUnreachableError as exc:
            controller["error"] = str(exc)
        try:
            controller["coordinator_published"] = client.published(INSTANCE)
        except ClusterUnreachableError as exc:
            controller["coordinator_error"] = str(exc)
        self.controller.append(controller)
        engines: dict[str, Any] = {"t": t, "at": at}
        for pod in self._cut.inst.pods:
            try:
                status = client.node_manager_status(pod.node_manager_url)
            except ClusterUnreachableError as exc:
                engines[pod.pod_id] = {"error": str(exc)}
                continue
            for endpoint in status.get("endpoints", []):
                engines[str(endpoint["endpoint_id"])] = {
                    "state": engine_state(endpoint),
                    "incarnation": endpoint.get("incarnation"),
                    "pid": endpoint.get("pid"),
                }
        self.engines.append(engines)


class Scenario:
    """One row's run and its evidence folder. Use as a context manager around the row's actions."""

    def __init__(self, cut: ClusterUnderTest, folder: Path) -> None:
        self.cut = cut
        self.folder = folder
        self.injections: list[dict[str, Any]] = []
        self.facts: dict[str, Any] = {}
        self._rounds_before: set[str] = set()
        self._sampler = _Sampler(cut)
        self.before: dict[str, Any] | None = None
        self.started_wall = time.time()

    # -- lifecycle ---------------------------------------------------------------------------------------------------
    def __enter__(self) -> Scenario:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.started_wall = time.time()
        self.before = self.cut.status()
        self._rounds_before = {str(r["request_id"]) for r in self._safe_rounds()}
        write_json(self.folder / "controller_status_before.json", self.before)
        write_json(self.folder / "coordinator_before.json", self._coordinator_view())
        self._sampler.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._sampler.stop()
        after = self.cut.status()
        write_json(self.folder / "controller_status_after.json", after)
        write_json(self.folder / "coordinator_after.json", self._coordinator_view())
        write_json(self.folder / "controller_status_series.json", self._sampler.controller)
        write_json(self.folder / "engine_status_series.json", self._sampler.engines)
        write_json(self.folder / "injections.json", self.injections)
        timelines = self.new_rounds()
        for timeline in timelines:
            write_json(self.folder / "rounds" / f"{timeline['request_id']}.json", timeline)
        summary = {
            "scenario": self.folder.name,
            "cluster": self.cut.name,
            "result": "passed" if error is None else f"failed: {type(error).__name__}: {error}",
            "dead_committed_before": (self.before or {}).get("dead_committed"),
            "dead_committed_after": (after or {}).get("dead_committed"),
            "phase_before": (self.before or {}).get("phase"),
            "phase_after": (after or {}).get("phase"),
            "phases_seen": _phases_seen(self._sampler.controller),
            "rounds": [
                {
                    "request_id": t["request_id"],
                    "kind": t.get("kind"),
                    "outcome": t.get("outcome"),
                    "decided": events(t, "decided"),
                    "gate": events(t, "gate"),
                    "applies": [
                        {"pod_id": e.get("pod_id"), "http_status": e.get("http_status"), "body": e.get("body")}
                        for e in events(t, "apply")
                    ],
                    "coordinator": [
                        {"op": e["kind"], "endpoint_ids": e.get("endpoint_ids")}
                        for e in t.get("events", [])
                        if str(e.get("kind", "")).startswith("coordinator_")
                    ],
                    "finalize": [
                        {"pod_id": e.get("pod_id"), "commit": e.get("commit"), "retired": e.get("retired")}
                        for e in events(t, "finalize")
                    ],
                    "pod_stops": events(t, "pod_stop"),
                    "stage_seconds": t.get("stage_seconds"),
                }
                for t in timelines
            ],
            **self.facts,
        }
        write_json(self.folder / "summary.json", summary)

    # -- injections --------------------------------------------------------------------------------------------------
    def fault(self, *args: str, target: Sequence[int]) -> str:
        """Run ``heteroflow fault <args>`` against this cluster (a subprocess, as an operator would)."""
        argv = [sys.executable, "-m", "heteroflow", "fault", *args, "--state-file", str(self.cut.state_file)]
        argv += ["--instance", INSTANCE]
        started = now_iso()
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        self.injections.append(
            {
                "command": [
                    "heteroflow",
                    "fault",
                    *args,
                    "--state-file",
                    str(self.cut.state_file),
                    "--instance",
                    INSTANCE,
                ],
                "target_ranks": list(target),
                "started_at": started,
                "finished_at": now_iso(),
                "exit_code": result.returncode,
                "stdout": result.stdout.strip(),
                "stderr": result.stderr.strip()[-2000:],
            }
        )
        assert result.returncode == 0, f"heteroflow fault {' '.join(args)} failed: {result.stderr}"
        return result.stdout

    def inject(self, what: str, action: Callable[[], Any], *, target: Sequence[int]) -> Any:
        """An injection made in-process (several ranks within milliseconds, or a request the CLI cannot make);
        ``what`` is the equivalent command or the HTTP call, recorded with its answer."""
        started = now_iso()
        answer = action()
        self.injections.append(
            {
                "command": what,
                "target_ranks": list(target),
                "started_at": started,
                "finished_at": now_iso(),
                "answer": answer,
            }
        )
        return answer

    # -- evidence helpers ------------------------------------------------------------------------------------------
    def fact(self, key: str, value: Any) -> Any:
        """Record one observation in ``summary.json`` (and return it, to assert on)."""
        self.facts[key] = value
        return value

    def inference(self, expected: Sequence[str] | None = None) -> list[str]:
        """Completions through the Coordinator after recovery, saved as ``inference_after_recovery.json``."""
        outputs = self.cut.completions()
        write_json(
            self.folder / "inference_after_recovery.json",
            {
                "via": f"POST {self.cut.state.coordinator_url}/v1/completions (admin token as API key)",
                "at": now_iso(),
                "prompts": list(PROMPTS),
                "outputs": outputs,
                "baseline_on_all_ranks": list(expected) if expected is not None else None,
                "equal_to_baseline": None if expected is None else outputs == list(expected),
            },
        )
        return outputs

    def t_of(self, monotonic: float) -> float:
        """A ``time.monotonic()`` value on the samples' time axis (``t``: seconds since the scenario began)."""
        return round(monotonic - self._sampler.started, 3)

    def series(self) -> list[dict[str, Any]]:
        """The controller samples taken so far (a copy)."""
        return list(self._sampler.controller)

    def sampled(self, predicate: Callable[[dict[str, Any]], bool], *, within: float = 10.0) -> dict[str, Any] | None:
        """The first controller sample matching ``predicate``, waiting up to ``within`` seconds for the sampler to
        take it (a state the scenario has just reached may not be sampled yet)."""
        deadline = time.monotonic() + within
        while True:
            found = first_sample(self.series(), predicate)
            if found is not None or time.monotonic() > deadline:
                return found
            time.sleep(POLL_PERIOD_SEC / 2)  # the sampler's own period paces this wait

    def engine_series(self) -> list[dict[str, Any]]:
        return list(self._sampler.engines)

    def new_rounds(self) -> list[dict[str, Any]]:
        """Every round timeline the controller holds that started during this scenario, oldest first."""
        found = []
        for summary in self._safe_rounds():
            request_id = str(summary["request_id"])
            if request_id in self._rounds_before:
                continue
            with contextlib.suppress(ClusterUnreachableError):
                found.append(self.cut.round(request_id))
        return found

    def save(self, name: str, data: Any) -> None:
        write_json(self.folder / name, data)

    def _safe_rounds(self) -> list[dict[str, Any]]:
        try:
            return self.cut.rounds()
        except ClusterUnreachableError:
            return []

    def _coordinator_view(self) -> Any:
        with self.cut.http(timeout_sec=5) as http:
            try:
                return http.get(self.cut.state.coordinator_url + COORDINATOR_INSTANCES_PATH).json()
            except (httpx.HTTPError, ValueError) as exc:
                return {"error": str(exc)}


def _phases_seen(samples: list[dict[str, Any]]) -> list[str]:
    seen: list[str] = []
    for sample in samples:
        phase = sample.get("phase")
        if isinstance(phase, str) and (not seen or seen[-1] != phase):
            seen.append(phase)
    return seen


def first_sample(samples: list[dict[str, Any]], predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
    return next((s for s in samples if predicate(s)), None)
