"""What a node may report: only the cards it registered, a bounded number of new cards, a bounded number of XIDs.

A node registers ``gpu_count`` cards, and the per-token card quota counts that number. Nothing made a node report
only those: four nodes of one card each reported indexes 0..4095 (16,384 cards in ``/metrics`` and the capability
list), one node sent 256 fresh uuids a beat (a row each), and 1,000 XID events a beat were all stored. So:

- a node has ``gpu_count`` card slots: the first ``gpu_count`` distinct indexes it reports (since its registration,
  in this server process) are its cards, and a card at any other index is refused, that card only (never the
  beat). Not "indexes below ``gpu_count``": a node's indexes need not be contiguous (an XPU node of three cards
  reports 0, 1 and 7, ``tests/integration/test_agent_beats.py``);
- a card's uuid changing at its index is a new card (a swap is normal, hundreds an hour are not): beyond
  ``new_cards_per_hour`` a node's new uuids are refused until the hour rolls over. The first uuid seen at each
  index is the node's inventory, not a change;
- XID events: at most ``xid_events_per_beat`` of one beat and ``xid_events_per_hour`` of one node are stored.

Every refusal is counted per node (:class:`NodeCardStatus`, shown in the node's status), and the first card a node
has refused is told to the caller so that it raises an alert. What a node may store is therefore bounded: its
``gpu_count`` cards (each a bounded number of rows by the write policy) plus the hour's new cards, and the hour's
XID events; an operator sees the bounds in the node's status and raises them through the settings.

:class:`CardBook` keeps this in memory, per server process, one small record per node that beats (its cards by
index, at most ``gpu_count`` of them). Purely computational: time is the caller's monotonic seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

HOUR_SEC: Final = 3600.0

NODE_CARDS_REFUSED: Final = "NODE_CARDS_REFUSED"
"""The alert raised on a node's first refused card or XID event."""


def cards_refused_message(*, node_name: str, registered: int) -> str:
    """The text of :data:`NODE_CARDS_REFUSED` (``health/text_codes.py`` knows its pattern)."""
    return (
        f"Node {node_name} reported cards or XID events beyond what it may ({registered} GPUs registered): those "
        "are refused, the rest of its beats is kept. Check the node's agent; if the node's cards changed, register "
        "it again with its gpu_count. The counts are in the node's status (cards)."
    )


@dataclass(frozen=True, slots=True)
class CardLimits:
    """What one node may report (the settings' values)."""

    new_cards_per_hour: int
    """Card uuids a node may report for the first time at an index that had another, per hour."""
    xid_events_per_beat: int
    """XID events of one beat that are stored; the rest are rejected with the reason."""
    xid_events_per_hour: int
    """XID events of one node stored per hour; the rest are rejected with the reason."""


@dataclass(frozen=True, slots=True)
class NodeCardStatus:
    """One node's card and XID bounds and what they refused, for its status."""

    registered_cards: int
    """The node's registered ``gpu_count``: how many distinct card indexes it may report."""
    known_cards: int
    """Cards (index, uuid) this server holds for the node."""
    new_cards_this_hour: int
    new_cards_per_hour: int
    xid_events_this_hour: int
    xid_events_per_hour: int
    xid_events_per_beat: int
    refused_index_total: int
    """Cards refused because their index is none of the node's ``gpu_count`` card slots."""
    refused_new_card_total: int
    """Cards refused because the node reported more new uuids this hour than it may."""
    refused_xid_total: int
    """XID events refused: an index beyond the node's cards, or over the bound of the beat or the hour."""


class _Node:
    __slots__ = (
        "cards",
        "hour_started",
        "inventory_free",
        "last",
        "new_cards",
        "refused_index",
        "refused_new",
        "refused_xid",
        "xid_events",
    )

    def __init__(self, now: float) -> None:
        self.cards: dict[int, str | None] = {}
        self.last: list[tuple[int, str | None]] | None = None
        """The newest beat's cards when every one was taken: the same list again (nearly every beat) is taken
        with one comparison."""
        self.inventory_free = True
        """Whether filling an empty slot is free (the node's first inventory), or counts as a new card (after
        :meth:`CardBook.relearn`: a re-registration must not reset the hour's bound)."""
        self.hour_started = now
        self.new_cards = 0
        self.xid_events = 0
        self.refused_index = 0
        self.refused_new = 0
        self.refused_xid = 0

    def roll(self, now: float) -> None:
        if now - self.hour_started >= HOUR_SEC:
            self.hour_started, self.new_cards, self.xid_events = now, 0, 0

    @property
    def refused(self) -> int:
        return self.refused_index + self.refused_new + self.refused_xid


@dataclass(frozen=True, slots=True)
class CardVerdict:
    refused: frozenset[int]
    """Indexes of the beat's cards that were refused (empty: every card was taken)."""
    first_refusal: bool
    """This beat holds the first card, or XID event, the node ever had refused (raise its alert)."""


ALL_TAKEN: Final = CardVerdict(refused=frozenset(), first_refusal=False)


class CardBook:
    """Each node's cards by index and its hour's new cards and XID events. Not thread-safe: one loop owns it."""

    def __init__(self, limits: CardLimits) -> None:
        self.limits = limits
        self._nodes: dict[str, _Node] = {}

    def admit(self, node_id: str, *, gpu_count: int, cards: list[tuple[int, str | None]], now: float) -> CardVerdict:
        """Which of a beat's cards (``(index, uuid)``) are taken; those refused are counted."""
        node = self._nodes.get(node_id)
        if node is None:
            node = self._nodes[node_id] = _Node(now)
        elif cards == node.last:  # the same cards as the node's previous beat: nearly every beat
            return ALL_TAKEN
        known = node.cards
        refused: set[int] | None = None
        before = node.refused
        for index, uuid in cards:
            held = known.get(index, _ABSENT)
            if held == uuid:  # the common case: the same card as last time
                continue
            if held is _ABSENT:
                if len(known) >= gpu_count:  # every slot taken by another index
                    node.refused_index += 1
                    refused = refused or set()
                    refused.add(index)
                    continue
                if not node.inventory_free:
                    node.roll(now)
                    if node.new_cards >= self.limits.new_cards_per_hour:
                        node.refused_new += 1
                        refused = refused or set()
                        refused.add(index)
                        continue
                    node.new_cards += 1
                known[index] = uuid  # the node's inventory: not a new card the first time
                continue
            if uuid is None or held is None:
                known[index] = uuid  # a uuid the agent could not read (or now can): not a new card
                continue
            node.roll(now)
            if node.new_cards >= self.limits.new_cards_per_hour:
                node.refused_new += 1
                refused = refused or set()
                refused.add(index)
                continue
            node.new_cards += 1
            known[index] = uuid
        if refused is None:
            node.last = cards
            return ALL_TAKEN
        node.last = None
        return CardVerdict(refused=frozenset(refused), first_refusal=before == 0)

    def has_card(self, node_id: str, *, index: int, gpu_count: int) -> bool:
        """Whether an event at ``index`` names one of the node's cards (or a slot it has not filled yet)."""
        node = self._nodes.get(node_id)
        return node is None or index in node.cards or len(node.cards) < gpu_count

    def take_xid_events(self, node_id: str, *, count: int, now: float) -> tuple[int, bool]:
        """How many of ``count`` XID events of one beat (already within its cards) may be stored, and whether a
        refusal here is the node's first. The rest are counted as refused."""
        node = self._nodes.get(node_id)
        if node is None:
            node = self._nodes[node_id] = _Node(now)
        node.roll(now)
        before = node.refused
        allowed = max(0, min(count, self.limits.xid_events_per_beat, self.limits.xid_events_per_hour - node.xid_events))
        node.xid_events += allowed
        node.refused_xid += count - allowed
        return allowed, allowed < count and before == 0

    def refuse_xid_events(self, node_id: str, *, count: int, now: float) -> bool:
        """Count ``count`` XID events refused for naming a card the node does not have; whether it is the first."""
        node = self._nodes.get(node_id)
        if node is None:
            node = self._nodes[node_id] = _Node(now)
        before = node.refused
        node.refused_xid += count
        return count > 0 and before == 0

    def status(self, node_id: str, *, gpu_count: int, now: float) -> NodeCardStatus:
        node = self._nodes.get(node_id)
        if node is not None:
            node.roll(now)
        limits = self.limits
        return NodeCardStatus(
            registered_cards=gpu_count,
            known_cards=len(node.cards) if node else 0,
            new_cards_this_hour=node.new_cards if node else 0,
            new_cards_per_hour=limits.new_cards_per_hour,
            xid_events_this_hour=node.xid_events if node else 0,
            xid_events_per_hour=limits.xid_events_per_hour,
            xid_events_per_beat=limits.xid_events_per_beat,
            refused_index_total=node.refused_index if node else 0,
            refused_new_card_total=node.refused_new if node else 0,
            refused_xid_total=node.refused_xid if node else 0,
        )

    def relearn(self, node_id: str) -> None:
        """The node registered again (its cards, or its ``gpu_count``, may have changed): its slots are learnt
        afresh from its next beats, each filled slot counting as a new card of the hour."""
        node = self._nodes.get(node_id)
        if node is not None:
            node.cards.clear()
            node.last = None
            node.inventory_free = False

    def forget(self, node_id: str) -> None:
        """Drop the node's record (deleted, or registered again: its cards are learnt afresh)."""
        self._nodes.pop(node_id, None)


_ABSENT: Final = object()
