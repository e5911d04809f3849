"""Each English text of the GPU health half has its stable code: built with its own function, read back by code."""

from __future__ import annotations

from datetime import timedelta

from heteroflow.health.alerts import PredictedFault, predicted_fault_message, resolution_by_backfill
from heteroflow.health.gpu_metrics import MEMORY_HIGH_RESOLUTION, memory_high_message
from heteroflow.health.predictions import XidObservation, judge
from heteroflow.health.rules import UNCONFIRMED_NOTE, Signal, evaluate
from heteroflow.health.samples import StoredSample
from heteroflow.health.statistics import BandCounts, Exposure, band_statistics
from heteroflow.health.text_codes import alert_text_code, conclusion_code, evidence_lines, reason_code
from heteroflow.health.weak_signals import WeakSignalParams, weak_signals
from tests.unit.health.test_gpu_metrics import T0 as METRICS_T0
from tests.unit.health.test_gpu_metrics import minute_rows
from tests.unit.health.test_predictions import CARD as PREDICTED_CARD
from tests.unit.health.test_predictions import END, T0, s
from tests.unit.health.test_rules import P, from_increases, view_from


def test_every_evidence_template_has_its_code_and_parameters() -> None:
    growth = evaluate(view_from(from_increases([10, 10, 10, 10, 40, 60, 90])), P).evidence
    (line,) = evidence_lines(growth)
    assert (line.layer, line.signal, line.code) == ("trend", "corrected_ecc_growth", "evidence.corrected_growth")
    assert line.params["increase"] == "90"
    assert line.params["increases"] == "[40, 60, 90]"
    quiet = lambda d: 100  # noqa: E731
    strong = evaluate(
        view_from(quiet, now_counters={"ecc_uncorrected_total": 2, "remapped_rows_failure": 1}), P
    ).evidence
    codes = [(line.signal, line.code, line.params.get("current")) for line in evidence_lines(strong)]
    assert ("uncorrectable_ecc", "evidence.total_new", "2") in codes
    assert ("remap_failure", "evidence.remap_failure_new", "1") in codes
    assert {line.params.get("label_code") for line in evidence_lines(strong)} >= {"uncorrectable_ecc"}
    t0 = METRICS_T0 + timedelta(days=3)
    rows = (
        minute_rows(t0 - timedelta(hours=1), 30, temperature_c=91)
        + minute_rows(t0 - timedelta(days=2), 60, power_w=300, utilization_pct=95.0)
        + minute_rows(t0 - timedelta(hours=3), 60, power_w=200, utilization_pct=95.0)
    )
    weak = weak_signals(rows, uuid="GPU-a", t0=t0, params=WeakSignalParams())
    text = "\n".join(f"{w.layer} signal [{w.code}]: {w.evidence}" for w in weak)
    by_signal = {line.signal: line for line in evidence_lines(text)}
    assert by_signal["temperature_high"].code == "evidence.temperature_high"
    assert by_signal["temperature_high"].params["peak"] == "91"
    assert by_signal["power_shift"].code == "evidence.power_shift"
    assert by_signal["power_shift"].params["change"] == "-33%"
    flood = evaluate(view_from(lambda d: 10**9 - round(d * 86_400 * 20)), P).evidence
    (line,) = evidence_lines(flood)
    assert (line.layer, line.signal, line.code) == ("weak", "corrected_ecc_flood", "evidence.corrected_flood")
    assert (line.params["rate"], line.params["flood_rate"], line.params["window"]) == ("20.0", "10", "24h")


def test_a_caveat_and_an_unknown_line_keep_their_text() -> None:
    caveat = UNCONFIRMED_NOTE.format(key="ecc_uncorrected_total")
    text = f"strong signal [uncorrectable_ecc]: uncorrectable ECC total 3 > 0 (no earlier value known){caveat}"
    (line,) = evidence_lines(text)
    assert line.code == "evidence.total_new"
    assert line.params["unconfirmed"] == "ecc_uncorrected_total"
    (odd,) = evidence_lines("weak signal [fan_noise]: the fan is loud")
    assert (odd.code, odd.text, odd.params) == (None, "the fan is loud", {})
    assert evidence_lines("free text from an older release") == []


def test_every_judgement_and_reason_has_its_code() -> None:
    def verdict(samples: list[StoredSample], xids: list[XidObservation] | None = None) -> str | None:
        j = judge(card=PREDICTED_CARD, t0=T0, end=END, now=END, samples=samples, xids=xids or [])
        assert j is not None
        found = conclusion_code(j.conclusion)
        return None if found is None else found.code

    day = timedelta(days=1)
    assert verdict([s(T0, 0)]) == "conclusion.voided_no_sample"
    assert verdict([s(T0, 0), s(T0 + day, 2)]) == "conclusion.hit_growth"
    xid = XidObservation(gpu_index=3, xid=48, occurred_at=T0 + day, uuid="GPU-3")
    assert verdict([s(T0, 0), s(T0 + day, 0)], [xid]) == "conclusion.hit_xid"
    assert verdict([s(T0, 0), s(T0 + day, 0, uuid="GPU-new")]) == "conclusion.voided_replaced"
    assert verdict([s(T0, None), s(T0 + day, None)]) == "conclusion.voided_unobservable"
    assert verdict([s(T0, 0), s(T0 + day, 0)]) == "conclusion.miss"
    assert conclusion_code("an operator's words") is None

    low = band_statistics(BandCounts(7, 0, 2, 1, 0, 0, 0), Exposure(4, 10.0, 3.0), min_matured=20, min_span_days=8)
    assert [(c.code, c.params) for c in map(reason_code, low.insufficient) if c] == [
        ("stats.matured", {"matured": "3", "min": "20"}),
        ("stats.span", {"span": "3.0", "min": "8"}),
    ]
    none = band_statistics(BandCounts(7, 0, 0, 0, 0, 0, 0), Exposure(0, 0.0, None), min_matured=20, min_span_days=8)
    assert [c.code for c in map(reason_code, none.insufficient) if c] == ["stats.matured", "stats.span_unknown"]
    enough = band_statistics(BandCounts(7, 0, 15, 5, 0, 0, 0), Exposure(4, 40.0, 9.0), min_matured=20, min_span_days=8)
    assert [c.code for c in map(reason_code, enough.insufficient) if c] == ["stats.recall_undefined"]


def test_alert_messages_resolutions_and_notes_have_their_codes() -> None:
    evidence = evaluate(view_from(from_increases([10, 10, 10, 10, 40, 60, 90])), P).evidence + (
        "\nstrong signal [uncorrectable_ecc]: uncorrectable ECC total 2 > 0 (no earlier value known)"
    )
    fault = predicted_fault_message(
        PredictedFault(
            node_name="gpu-07", gpu_index=3, uuid="GPU-3", window_days=7, rule_version="v1", evidence=evidence
        )
    )
    found = alert_text_code(fault)
    assert found is not None
    assert found.code == "alert.fault_predicted"
    assert {k: found.params[k] for k in ("node", "gpu_index", "uuid", "window_days", "rule_version")} == {
        "node": "gpu-07",
        "gpu_index": "3",
        "uuid": "GPU-3",
        "window_days": "7",
        "rule_version": "v1",
    }
    quoted = evidence_lines(found.params["evidence"])
    assert [line.code for line in quoted] == ["evidence.corrected_growth", "evidence.total_new"]
    no_uuid = predicted_fault_message(
        PredictedFault(node_name="n 1", gpu_index=0, uuid=None, window_days=30, rule_version="v1", evidence=evidence)
    )
    found = alert_text_code(no_uuid)
    assert found is not None
    assert "uuid" not in found.params
    assert found.params["node"] == "n 1"
    high = memory_high_message(node_name="gpu-07", gpu_indexes=[0, 2], share=0.95, duration=timedelta(minutes=10))
    found = alert_text_code(high)
    assert found is not None
    assert found.params == {
        "node": "gpu-07",
        "cards": "GPU 0, GPU 2",
        "share": "95%",
        "minutes": "10",
    }
    window = resolution_by_backfill({0: "miss"}, any_hit=False)
    codes = [alert_text_code(t) for t in (window or "", MEMORY_HIGH_RESOLUTION, "node deleted")]
    assert [c.code if c else None for c in codes] == [
        "resolution.window_expired",
        "resolution.memory_dropped",
        "resolution.node_deleted",
    ]
    assert alert_text_code("replaced the card, see ticket 42") is None


def test_signal_lines_with_their_separator_inside_a_line() -> None:
    lines = [Signal("trend", "x", "a; b"), Signal("weak", "y", "c")]
    text = "; ".join(f"{sig.layer} signal [{sig.code}]: {sig.evidence}" for sig in lines)
    assert [line.text for line in evidence_lines(text)] == ["a; b", "c"]
