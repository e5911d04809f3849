"""The host-wide ``/metrics`` of ``heteroflow server --workers N``: what the worker a scrape reaches spends.

``--nodes`` nodes (default 3,000) x 8 cards split over ``--workers`` workers (default 2), ``--moved`` of the nodes
(default 5 %) heard by two workers (their connection moved). Times, as the best of ``--rounds`` (CPU time of this
process, all the steps of one scrape in a row, no sockets), two ways of merging the workers' metrics:

- *series* (the way before, the baseline): every worker writes its whole exposition, per-GPU lines included, and
  the asking worker parses every text back and merges them series by series (``merge_expositions``); the
  counter-typed ECC totals of a card two workers heard come out summed;
- *cards* (``platform_server/workers.py`` now): every sibling sends its registry's text and its cards as JSON
  (``encode_answer``), the asking worker decodes them, merges the registries as series and the cards card by card
  (``merge_cards``) and writes the per-GPU lines once.

Prints both, the ratio, and how many per-GPU samples the series way got wrong (a moved node's ECC totals).
Usage::

    .venv/bin/python bench/worker_metrics.py [--nodes 3000] [--workers 2] [--moved 0.05] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: bench.metrics_exposition
from bench.metrics_exposition import fleet
from heteroflow.platform_server.metrics import CARD_ITEMS, FlatCards, ServerMetrics, flat_cards, flat_exposition
from heteroflow.platform_server.workers import decode_answer, encode_answer, merge_cards, merge_expositions


def split(cards: FlatCards, *, workers: int, moved: float) -> list[FlatCards]:
    """Each worker's cards: nodes dealt round-robin, and every ``1 / moved``-th node also held by the next worker
    (the same values: the merge must report them once)."""
    per_node = 8 * CARD_ITEMS
    parts: list[FlatCards] = [[] for _ in range(workers)]
    every = round(1 / moved) if moved > 0 else 0
    for node, start in enumerate(range(0, len(cards), per_node)):
        parts[node % workers] += cards[start : start + per_node]
        if every and node % every == 0:
            parts[(node + 1) % workers] += cards[start : start + per_node]
    return parts


def by_series(owns: list[bytes], parts: list[FlatCards]) -> bytes:
    texts = [(own + flat_exposition(cards)).decode() for own, cards in zip(owns, parts, strict=True)]
    return merge_expositions(texts)


def by_cards(owns: list[bytes], parts: list[FlatCards]) -> bytes:
    siblings = zip(owns[1:], parts[1:], strict=True)
    heard = [(owns[0].decode(), parts[0]), *(decode_answer(encode_answer(own, found)) for own, found in siblings)]
    registry = merge_expositions([text for text, _ in heard])
    return registry + flat_exposition(merge_cards([cards for _, cards in heard]))


def best(
    merge: Callable[[list[bytes], list[FlatCards]], bytes], owns: list[bytes], parts: list[FlatCards], rounds: int
) -> tuple[float, bytes]:
    times, text = [], b""
    for _ in range(rounds):
        started = time.process_time()
        text = merge(owns, parts)
        times.append(time.process_time() - started)
    return min(times), text


def gpu_samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text.decode())
        if family.name.startswith("heteroflow_gpu_")
        for sample in family.samples
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--nodes", type=int, default=3000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--moved", type=float, default=0.05)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    cards = flat_cards(fleet(args.nodes))
    parts = split(cards, workers=args.workers, moved=args.moved)
    owns = [ServerMetrics().render() for _ in parts]  # a worker's registry series (no cards watched: none)
    series, series_text = best(by_series, owns, parts, args.rounds)
    merged, merged_text = best(by_cards, owns, parts, args.rounds)
    truth = gpu_samples(flat_exposition(cards))
    wrong = {
        way: sum(1 for key, value in gpu_samples(text).items() if truth.get(key) != value)
        for way, text in (("series", series_text), ("cards", merged_text))
    }
    print(
        f"{len(cards) // CARD_ITEMS:,} cards over {args.workers} workers, {args.moved:.0%} of the nodes heard by two; "
        f"best of {args.rounds}, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    for way, took in (
        ("series (parse every text, merge series)", series),
        ("cards (JSON cards, merged per card)", merged),
    ):
        print(f"{way:<41} {took * 1000:7.0f} ms CPU, {wrong[way.split()[0]]:,} per-GPU samples wrong")
    print(f"cards / series: x{merged / series:.3f}")


if __name__ == "__main__":
    main()
