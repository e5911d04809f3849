from __future__ import annotations

import re

from heteroflow.health.text_codes import alert_text_code
from heteroflow.platform.cards import HOUR_SEC, CardBook, CardLimits, cards_refused_message

LIMITS = CardLimits(new_cards_per_hour=2, xid_events_per_beat=3, xid_events_per_hour=5)


def cards(*uuids: str | None, start: int = 0) -> list[tuple[int, str | None]]:
    return [(start + n, uuid) for n, uuid in enumerate(uuids)]


def test_a_card_beyond_the_registered_count_is_refused_and_the_others_taken() -> None:
    book = CardBook(LIMITS)
    verdict = book.admit("n", gpu_count=2, cards=[(0, "A"), (7, "B"), (2, "C"), (4095, "D")], now=0.0)
    assert verdict.refused == frozenset({2, 4095})  # two slots: the first two distinct indexes (not contiguous)
    assert verdict.first_refusal
    again = book.admit("n", gpu_count=2, cards=[(0, "A"), (7, "B"), (1, "E")], now=1.0)
    assert (again.refused, again.first_refusal) == (frozenset({1}), False)  # the alert is raised once
    status = book.status("n", gpu_count=2, now=1.0)
    assert (status.known_cards, status.refused_index_total, status.refused_new_card_total) == (2, 3, 0)
    assert book.has_card("n", index=7, gpu_count=2)
    assert not book.has_card("n", index=1, gpu_count=2)


def test_registering_again_relearns_the_slots_within_the_hours_bound() -> None:
    book = CardBook(LIMITS)
    book.admit("n", gpu_count=1, cards=[(0, "A")], now=0.0)
    book.relearn("n")  # a re-registration never resets the bound: each refilled slot is a new card
    assert book.admit("n", gpu_count=1, cards=[(5, "B")], now=1.0).refused == frozenset()
    book.relearn("n")
    assert book.admit("n", gpu_count=1, cards=[(6, "C")], now=2.0).refused == frozenset()
    book.relearn("n")
    assert book.admit("n", gpu_count=1, cards=[(7, "D")], now=3.0).refused == frozenset({7})


def test_the_same_cards_beat_after_beat_cost_nothing_and_refuse_nothing() -> None:
    book = CardBook(LIMITS)
    for second in range(100):
        verdict = book.admit("n", gpu_count=8, cards=cards(*(f"GPU-{i}" for i in range(8))), now=float(second))
        assert verdict.refused == frozenset()
    status = book.status("n", gpu_count=8, now=100.0)
    assert (status.known_cards, status.new_cards_this_hour, status.refused_new_card_total) == (8, 0, 0)


def test_new_uuids_at_an_index_are_bounded_per_hour_and_the_bound_rolls_over() -> None:
    book = CardBook(LIMITS)
    book.admit("n", gpu_count=1, cards=[(0, "first")], now=0.0)  # the inventory: not a new card
    taken = [book.admit("n", gpu_count=1, cards=[(0, f"swap-{n}")], now=float(n)).refused for n in range(1, 5)]
    assert taken == [frozenset(), frozenset(), frozenset({0}), frozenset({0})]  # two swaps an hour
    assert book.status("n", gpu_count=1, now=5.0).refused_new_card_total == 2
    assert book.admit("n", gpu_count=1, cards=[(0, "swap-9")], now=HOUR_SEC + 1).refused == frozenset()
    assert book.admit("n", gpu_count=1, cards=[(0, None)], now=HOUR_SEC + 2).refused == frozenset()  # unread uuid


def test_xid_events_are_bounded_per_beat_and_per_node_hour() -> None:
    book = CardBook(LIMITS)
    assert book.take_xid_events("n", count=10, now=0.0) == (3, True)  # 3 a beat; the first refusal
    assert book.take_xid_events("n", count=10, now=1.0) == (2, False)  # 5 an hour
    assert book.take_xid_events("n", count=1, now=2.0) == (0, False)
    assert book.take_xid_events("n", count=1, now=HOUR_SEC + 1) == (1, False)
    assert book.refuse_xid_events("other", count=2, now=0.0)
    status = book.status("n", gpu_count=1, now=HOUR_SEC + 1)
    assert (status.xid_events_this_hour, status.refused_xid_total) == (1, 16)
    book.forget("n")
    assert book.status("n", gpu_count=1, now=0.0).refused_xid_total == 0


def test_the_alert_text_has_its_code() -> None:
    text = cards_refused_message(node_name="gpu-07", registered=1)
    code = alert_text_code(text)
    assert code is not None
    assert (code.code, code.params) == ("alert.cards_refused", {"node": "gpu-07", "registered": "1"})
    assert re.search(r"\(cards\)\.$", text)
