"""The controller's pure core: every DP scale-down decision, and no I/O (``docs/controller-core.md``).

Purely computational, no side effects: frozen records in, a new record or a decision out. Time is a value
(``now``: seconds on the shell's monotonic clock). Nothing here imports a web framework, an HTTP client, a
store driver or ``asyncio``; the shell (``service.py``, ``strategy.py``, ``fallbacks.py``) loads, calls
these functions and applies their decisions.

- :mod:`.phase` — :class:`FtPhase` and its only legal transitions (F-30).
- :mod:`.runtime` — :class:`ScaleDownContext`, :class:`FtRuntime`, its persisted subset and restart (F-31, F-32).
- :mod:`.normalizer` — software evidence → snapshot (F-10); hardware faults → original DP ranks (F-3).
- :mod:`.topology` — the instance's topology, capability agreement, NodeManager grouping (F-21…F-23, F-25).
- :mod:`.gate` — FtGate with reason codes (F-21, F-55).
- :mod:`.decision` — the FaultManager decision (F-10, F-12, F-13, F-59).
- :mod:`.readiness` — the round's survivor polls before and after apply (F-24, F-26, F-51).
- :mod:`.overlay` — the ServingOverlay projection (F-40).
"""
