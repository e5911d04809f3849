"""Errors that cross package boundaries."""

from __future__ import annotations


class StoreUnavailableError(Exception):
    """A store could not be reached or timed out; the operation may succeed if retried later."""
