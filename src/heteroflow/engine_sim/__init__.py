"""Engine simulator: one simulated vLLM DP rank that speaks the fault-tolerance protocol.

Layout (the API-server side never imports torch; only ``model`` and ``worker`` do):

- the wire models of the FT protocol live in :mod:`heteroflow.contracts.engine_protocol` (shared with the
  NodeManager and the controller).
- ``state`` — the pure FT state machine; ``placement`` — pure EPLB expert placement.
- ``engine`` — the engine core, the thin shell around ``state``; ``backend`` — its worker seam.
- ``process_backend`` + ``worker`` + ``model`` — the real worker: a torch subprocess in a gloo group.
- ``fake`` — the in-process worker double; ``testing`` — fake and multi-process clusters;
  ``conformance`` — the protocol scenarios run against both.
- ``assembly`` — the HTTP API (OpenAI-compatible, FT routes, sim-only fault injection), put together from the
  routers of ``routes`` (thin handlers) over ``completions`` (vLLM's answers and streams).
"""
