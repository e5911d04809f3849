"""The shipped Prometheus alerting rules (``deploy/prometheus/heteroflow-alerts.yaml``) under the real
``promtool``: they parse, and their unit tests (``heteroflow-alerts.test.yaml``) pass. A rule that stops firing
when it should, or fires when it should not, fails here."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import yaml

from tests.support.monitoring import RULE_TESTS, RULES, promtool


def test_the_rules_parse() -> None:
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    shipped = sum(len(group["rules"]) for group in yaml.safe_load(RULES.read_text())["groups"])
    assert f"SUCCESS: {shipped} rules found" in checked.stdout


def test_the_rules_unit_tests_pass() -> None:
    tested = promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_every_rule_has_a_unit_test_that_fires_it() -> None:
    rules = [rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired = {case["alertname"] for test in tests for case in test["alert_rule_test"] if case["exp_alerts"]}
    assert set(rules) == fired


def test_a_broken_threshold_fails_the_unit_tests(tmp_path: Path) -> None:
    """The unit tests can fail: the same tests against rules whose RECONFIGURING wait is 20 minutes."""
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    text = RULES.read_text()
    broken, count = re.subn(r"for: 10m", "for: 20m", text)
    assert count == 1
    (tmp_path / RULES.name).write_text(broken)
    tested = promtool("test", "rules", RULE_TESTS.name, cwd=tmp_path)
    assert tested.returncode != 0
    assert "HeteroflowServingStuckReconfiguring" in tested.stdout + tested.stderr
