"""Every alert has a runbook, and every runbook an alert (``docs/runbooks/``).

A Prometheus rule in ``deploy/prometheus/heteroflow-alerts.yaml`` links its page with a ``runbook_url`` that is the
page's path in the repository; the platform's own alert types have a page each under ``docs/runbooks/platform/``.
A rule without a page, a page without a rule, a ``runbook_url`` that does not resolve, or a page without one of the
sections an on-call engineer reads, fails here. ``promtool check rules`` runs in
``tests/integration/monitoring/test_rules.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from heteroflow.health.alerts import GPU_FAULT_PREDICTED
from heteroflow.health.gpu_metrics import GPU_MEMORY_HIGH
from heteroflow.platform.cards import NODE_CARDS_REFUSED
from heteroflow.platform_server.alert_delivery import RUNBOOK_PAGES

REPO = Path(__file__).resolve().parents[3]
RULES = REPO / "deploy" / "prometheus" / "heteroflow-alerts.yaml"
RUNBOOKS = REPO / "docs" / "runbooks"
PLATFORM_ALERT_TYPES = frozenset({GPU_FAULT_PREDICTED, GPU_MEMORY_HIGH, NODE_CARDS_REFUSED})
SECTIONS = ("## What fired and why", "## How to confirm", "## What to do", "## What not to do", "## When to escalate")
_LINK = re.compile(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)")


def runbook_problems(rules_text: str, *, repo: Path) -> list[str]:
    """What keeps the rules and the runbook pages out of step (empty when they agree)."""
    problems: list[str] = []
    rules = [rule for group in yaml.safe_load(rules_text)["groups"] for rule in group["rules"]]
    names = {rule["alert"] for rule in rules}
    for rule in rules:
        url = rule.get("annotations", {}).get("runbook_url")
        expected = f"docs/runbooks/{rule['alert']}.md"
        if url is None:
            problems.append(f"{rule['alert']}: no runbook_url annotation")
        elif url != expected:
            problems.append(f"{rule['alert']}: runbook_url {url!r} is not {expected!r}")
        if not (repo / expected).is_file():
            problems.append(f"{rule['alert']}: no page {expected}")
    pages = {page.stem for page in (repo / "docs" / "runbooks").glob("*.md") if page.name != "README.md"}
    problems.extend(f"docs/runbooks/{page}.md: no rule of that name" for page in sorted(pages - names))
    return problems


def test_every_rule_has_its_page_and_every_page_its_rule() -> None:
    assert runbook_problems(RULES.read_text(), repo=REPO) == []


def test_a_rule_that_loses_its_page_fails(tmp_path: Path) -> None:
    """The check can fail: the same rules against a copy of the pages with one page missing."""
    (tmp_path / "docs" / "runbooks").mkdir(parents=True)
    for page in RUNBOOKS.glob("*.md"):
        if page.name != "HeteroflowTargetDown.md":
            (tmp_path / "docs" / "runbooks" / page.name).write_text(page.read_text())
    assert runbook_problems(RULES.read_text(), repo=tmp_path) == [
        "HeteroflowTargetDown: no page docs/runbooks/HeteroflowTargetDown.md"
    ]


def test_a_rule_without_runbook_url_and_a_page_without_rule_fail() -> None:
    text = RULES.read_text()
    stripped, count = re.subn(r"\n\s*runbook_url: docs/runbooks/HeteroflowRoundsFailing\.md", "", text)
    assert count == 1
    renamed = stripped.replace("alert: HeteroflowTargetDown", "alert: HeteroflowTargetGone")
    assert runbook_problems(renamed, repo=REPO) == [
        "HeteroflowRoundsFailing: no runbook_url annotation",
        "HeteroflowTargetGone: runbook_url 'docs/runbooks/HeteroflowTargetDown.md' is not "
        "'docs/runbooks/HeteroflowTargetGone.md'",
        "HeteroflowTargetGone: no page docs/runbooks/HeteroflowTargetGone.md",
        "docs/runbooks/HeteroflowTargetDown.md: no rule of that name",
    ]


def test_every_platform_alert_type_has_its_page() -> None:
    pages = {page.stem for page in (RUNBOOKS / "platform").glob("*.md")}
    assert pages == PLATFORM_ALERT_TYPES


def test_the_platform_sends_each_alert_type_with_its_page() -> None:
    """What reaches an Alertmanager directly names the same pages (``runbook_url``)."""
    assert set(RUNBOOK_PAGES) == PLATFORM_ALERT_TYPES
    assert all(RUNBOOK_PAGES[kind] == f"docs/runbooks/platform/{kind}.md" for kind in RUNBOOK_PAGES)
    assert all((REPO / path).is_file() for path in RUNBOOK_PAGES.values())


def _pages() -> list[Path]:
    return sorted(page for page in RUNBOOKS.rglob("*.md") if page.name != "README.md")


@pytest.mark.parametrize("page", _pages(), ids=lambda page: page.stem)
def test_a_page_has_the_sections_an_on_call_engineer_reads(page: Path) -> None:
    text = page.read_text()
    assert text.startswith(f"# {page.stem}")
    missing = [section for section in SECTIONS if section not in text]
    assert missing == []
    positions = [text.index(section) for section in SECTIONS]
    assert positions == sorted(positions)


@pytest.mark.parametrize("page", sorted(RUNBOOKS.rglob("*.md")), ids=lambda page: page.stem)
def test_the_links_of_a_page_resolve(page: Path) -> None:
    targets = _LINK.findall(page.read_text())
    assert [target for target in targets if not (page.parent / target).resolve().is_file()] == []


def test_the_index_links_every_page() -> None:
    linked = set(_LINK.findall((RUNBOOKS / "README.md").read_text()))
    assert linked == {str(page.relative_to(RUNBOOKS)) for page in _pages()}
