"""The NodeManager: one per pod; launches and supervises its engines and proxies their fault tolerance.

Layers, pure first: ``spec`` (instance spec, engine command lines), ``service`` (the guard/apply/finalize
state machine), ``ft_manager`` (poll decisions), ``heartbeat`` (the endpoint set), then the shell:
``supervisor`` (processes), ``engines`` (engine HTTP client), ``client`` (controller client), ``daemon``
(ties them together), ``app`` (the HTTP routes). See ``docs/node-manager.md``.
"""
