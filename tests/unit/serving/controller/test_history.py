"""The round history keeps one timeline per request id and never merges two rounds into one."""

from __future__ import annotations

import pytest

from heteroflow.core.testing import FakeClock
from heteroflow.serving.controller.history import RoundHistory


def test_an_id_already_recorded_is_refused_and_the_first_timeline_is_kept() -> None:
    history = RoundHistory(FakeClock())
    history.begin("fb-1", instance_id="inst-1", kind="fallback")
    history.add("fb-1", "fallback", strategy="InstanceReconfiguration")
    with pytest.raises(ValueError, match="already recorded"):
        history.begin("fb-1", instance_id="inst-2", kind="fallback")
    record = history.get("fb-1")
    assert record is not None
    assert record.instance_id == "inst-1"
    assert [event["kind"] for event in record.as_json()["events"]] == ["fallback"]
