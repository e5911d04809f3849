"""The live view's pure parts: what ``heteroflow status`` says about an instance's engines."""

from __future__ import annotations

from heteroflow.local.view import LineLog, Snapshot, engine_line, rank_rows


def entry(**extra: object) -> dict[str, object]:
    return {
        "instance_id": "inst-1",
        "phase": "NORMAL",
        "can_serve": True,
        "original_dp_ranks": [0, 1, 2, 3],
        "published_endpoints": [0, 1, 3],
        "dead_committed": [],
        "engine_statuses": {"2": "diagnosing"},
        **extra,
    }


def test_the_engines_line_names_the_profile_and_what_it_can_do() -> None:
    capability = {
        "protocol_profile": "vllm-0.34",
        "scale_down_supported": True,
        "retry_supported": True,
        "elastic_ep_supported": False,
    }
    assert engine_line(entry(engine_capability=capability)) == (
        "engines: vllm-0.34   scale-down supported   retry supported   elastic EP unsupported"
    )
    undiscovered = {"protocol_profile": None, "scale_down_supported": True}
    assert engine_line(entry(engine_capability=undiscovered)) == (
        "engines: not discovered yet   scale-down supported   retry unknown   elastic EP unknown"
    )
    assert engine_line(entry()) == "engines: not known yet"


def test_a_diagnosing_rank_shows_as_diagnosing_and_the_line_log_names_the_profile() -> None:
    rows = rank_rows(entry(), None)
    assert rows[2] == ("2", "", "diagnosing", "no", "")
    capability = {"protocol_profile": "vllm-0.34", "scale_down_supported": True, "retry_supported": True}
    lines = LineLog().lines(Snapshot(entries={"inst-1": entry(engine_capability=capability)}))
    assert len(lines) == 1
    assert "engines: vllm-0.34   scale-down supported" in lines[0]
