"""Stable codes for the English texts the GPU health half writes (alerts, evidence, conclusions, reasons).

The texts are stored as written (alert messages, history notes, prediction evidence and conclusions) and kept in
the API for CLI and API users. Beside each the API sends a code and its parameters, so that a page can show the
text in its own language. The code is derived from the text by the patterns below, at read time: rows written
before the codes existed get them too, and a text no pattern knows (a reason typed by an operator) has no code —
a page shows it as written. Purely computational, no side effects.

Every pattern here matches a template of this package (health/alerts.py, health/gpu_metrics.py, health/rules.py,
health/weak_signals.py, health/predictions.py, health/statistics.py, storage/alert_store.py); the unit tests build
each text with its own function and check its code, so a template that changes without its pattern fails there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final

from heteroflow.health.rules import UNCONFIRMED_NOTE


@dataclass(frozen=True, slots=True)
class TextCode:
    code: str
    params: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class EvidenceLine:
    """One line of a prediction's evidence: ``<layer> signal [<signal>]: <text>``."""

    layer: str
    signal: str
    text: str
    code: str | None
    params: dict[str, str]


def _table(*rows: tuple[str, str]) -> tuple[tuple[str, re.Pattern[str]], ...]:
    return tuple((code, re.compile(pattern)) for code, pattern in rows)


_EVIDENCE: Final = _table(
    ("evidence.total_new", r"(?P<label>.+) total (?P<current>\d+) > 0 \(no earlier value known\)"),
    (
        "evidence.grew_since",
        r"(?P<label>.+) grew from (?P<start>-?\d+) to (?P<current>\d+) since (?P<since>\S+) "
        r"\(lifetime total (?P<total>\d+)\)",
    ),
    ("evidence.remap_failure_new", r"row remapping failure (?P<current>\d+) > 0 \(spare rows exhausted\)"),
    ("evidence.remap_failure_since", r"row remapping failure set since (?P<since>\S+) \(spare rows exhausted\)"),
    (
        "evidence.corrected_growth",
        r"corrected ECC \+(?P<increase>\d+) in the last (?P<window>\S+) \(≥ (?P<min_increase>\d+)\), "
        r"(?P<ratio>\S+)x the (?P<baseline_days>\S+)-day mean \(≥ (?P<min_ratio>\S+)x\); "
        r"increases of the last (?P<windows>\d+) windows (?P<increases>\[[^\]]*\]) strictly increase",
    ),
    ("evidence.grew_in_days", r"(?P<label>.+) grew from (?P<start>-?\d+) to (?P<current>\d+) in (?P<days>\S+) days"),
    (
        "evidence.corrected_flood",
        r"corrected ECC \+(?P<increase>\d+) in the last (?P<window>\S+), (?P<rate>\S+) a second "
        r"\(flood rate (?P<flood_rate>\S+) a second\)",
    ),
    (
        "evidence.temperature_high",
        r"(?P<minutes>\d+) minutes at or above (?P<threshold>\S+) °C in the last (?P<hours>\S+)h "
        r"\(peak (?P<peak>\S+) °C\)",
    ),
    (
        "evidence.power_shift",
        r"mean power at >= (?P<utilization>\S+)% utilisation (?P<recent>\S+) W in the last (?P<hours>\S+)h "
        r"vs (?P<earlier>\S+) W before \((?P<change>[+-]?\S+)\)",
    ),
)

_CONCLUSIONS: Final = _table(
    ("conclusion.voided_no_sample", r"voided: no sample inside the window \(collection stalled or node offline\)"),
    ("conclusion.hit_growth", r"hit: (?P<label>.+) grew from (?P<start>-?\d+) to (?P<current>\d+) at (?P<at>\S+)"),
    ("conclusion.hit_xid", r"hit: XID (?P<xid>\d+) at (?P<at>\S+)"),
    ("conclusion.voided_replaced", r"voided: the card was replaced inside the window \(uuid changed\)"),
    (
        "conclusion.voided_unobservable",
        r"voided: the uncorrectable-ECC count was unknown in every sample of the window \(unobservable\)",
    ),
    (
        "conclusion.miss",
        r"miss: window expired with (?P<samples>\d+) samples inside it and no uncorrectable-ECC growth",
    ),
)

_REASONS: Final = _table(
    (
        "stats.matured",
        r"(?P<matured>\d+) of ≥ (?P<min>\d+) matured predictions \(hit \+ miss; voided excluded\)",
    ),
    ("stats.span_unknown", r"observation span unknown \(no samples\); ≥ (?P<min>\S+) days needed"),
    ("stats.span", r"observed (?P<span>\S+) of ≥ (?P<min>\S+) days"),
    ("stats.recall_undefined", r"no failed card in the period: recall undefined"),
)

_ALERT_TEXTS: Final = _table(
    (
        "alert.fault_predicted",
        r"Memory fault predicted on (?P<node>.+?) GPU (?P<gpu_index>\d+)(?: \((?P<uuid>[^)]*)\))? within "
        r"(?P<window_days>\d+) days \(experimental rule (?P<rule_version>[^)]+)\)\. Hardware error counters are "
        r"degrading: plan a maintenance window and prepare a replacement card\. Evidence: (?P<evidence>.*)",
    ),
    (
        "alert.memory_high",
        r"GPU memory nearly full on (?P<node>.+) \((?P<cards>GPU \d+(?:, GPU \d+)*)\): above (?P<share>\d+%) of "
        r"memory for at least (?P<minutes>\d+) minutes\. The card itself is healthy and busy; this is the "
        r"workload's memory use, not a hardware problem\. Check the job's batch size or memory settings, or "
        r"schedule it on a card with more memory\.",
    ),
    (  # heteroflow/platform/cards.py: cards_refused_message
        "alert.cards_refused",
        r"Node (?P<node>.+) reported cards or XID events beyond what it may \((?P<registered>\d+) GPUs registered\): "
        r"those are refused, the rest of its beats is kept\. Check the node's agent; if the node's cards changed, "
        r"register it again with its gpu_count\. The counts are in the node's status \(cards\)\.",
    ),
    ("resolution.window_expired", r"window expired, no uncorrectable-ECC growth"),
    ("resolution.memory_dropped", r"memory use dropped below the threshold \(or is no longer reported\)"),
    ("resolution.node_deleted", r"node deleted"),
    ("history.backlog", r"open for too long: operations backlog"),
)

# the counter names the templates write, by the signal code a page names them with
_LABELS: Final = {
    "uncorrectable ECC": "uncorrectable_ecc",
    "rows remapped after uncorrectable errors": "uncorrectable_remap",
    "row remapping": "remap_failure",
    "pending row remaps": "pending_remap_growth",
    "retired pages": "retired_pages_growth",
}

_LINE: Final = re.compile(r"(?P<layer>strong|trend|weak) signal \[(?P<signal>[a-z0-9_]+)\]: ")
_CAVEAT: Final = re.compile(re.escape(UNCONFIRMED_NOTE).replace(re.escape("{key}"), r"(?P<key>[a-z0-9_]+)") + "$")


def _match(table: tuple[tuple[str, re.Pattern[str]], ...], text: str | None) -> TextCode | None:
    if not text:
        return None
    for code, pattern in table:
        found = pattern.fullmatch(text)
        if found is not None:
            params = {k: v for k, v in found.groupdict().items() if v is not None}
            if params.get("label") in _LABELS:
                params["label_code"] = _LABELS[params["label"]]
            return TextCode(code, params)
    return None


def evidence_lines(evidence: str | None) -> list[EvidenceLine]:
    """The evidence's lines (newline-separated, or "; "-joined as in an alert message), each with its code."""
    if not evidence:
        return []
    starts = list(_LINE.finditer(evidence))
    lines: list[EvidenceLine] = []
    for i, start in enumerate(starts):
        if i == 0 and start.start() != 0:
            return []  # not this package's evidence: nothing to code
        end = starts[i + 1].start() if i + 1 < len(starts) else len(evidence)
        text = evidence[start.end() : end]
        text = text.removesuffix("\n").removesuffix("; ") if i + 1 < len(starts) else text.rstrip("\n")
        params: dict[str, str] = {}
        caveat = _CAVEAT.search(text)
        body = text[: caveat.start()] if caveat else text
        coded = _match(_EVIDENCE, body)
        if coded is not None:
            params = dict(coded.params)
            if caveat:
                params["unconfirmed"] = caveat.group("key")
        lines.append(
            EvidenceLine(
                layer=start.group("layer"),
                signal=start.group("signal"),
                text=text,
                code=coded.code if coded else None,
                params=params,
            )
        )
    return lines


def conclusion_code(conclusion: str | None) -> TextCode | None:
    return _match(_CONCLUSIONS, conclusion)


def reason_code(reason: str) -> TextCode | None:
    """A prediction-statistics band's reason (``insufficient``)."""
    return _match(_REASONS, reason)


def alert_text_code(text: str | None) -> TextCode | None:
    """An alert's message, a system resolution, or a history note (a raised event's note is the message)."""
    return _match(_ALERT_TEXTS, text)
