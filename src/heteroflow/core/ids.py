"""Identifier types shared across packages."""

from __future__ import annotations

from typing import Literal, NewType

NodeId = NewType("NodeId", str)
TenantId = NewType("TenantId", str)
TokenId = NewType("TokenId", str)

Source = Literal["real", "simulated"]
"""Where samples come from: real agents, or the simulation generator (never mixed, H-70)."""

SOURCES: tuple[Source, ...] = ("real", "simulated")
