"""Identifier types of the controller core."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NewType

DpRank = NewType("DpRank", int)
"""An original global DP rank; equal to the endpoint id (RFC §4.1). Never renumbered (F-31)."""

InstanceId = NewType("InstanceId", str)
RequestId = NewType("RequestId", str)
"""One scale-down round's id, the same on every NodeManager and engine of the round."""
PodId = NewType("PodId", str)


def ranks(values: Iterable[int]) -> frozenset[DpRank]:
    """A frozen set of DP ranks; negative values are refused (they are original global ranks)."""
    result = frozenset(DpRank(value) for value in values)
    if any(value < 0 for value in result):
        raise ValueError(f"DP ranks are non-negative; got {sorted(result)}")
    return result
