"""The Coordinator: routes OpenAI-compatible requests to the published endpoints of each serving instance.

The controller changes what is published through three management operations (DEL, ADD, SET;
:mod:`heteroflow.contracts.serving`); the Coordinator never makes a fault decision (``serving-ft.md``
components table, F-40, F-41).

Layers, pure first: ``views`` (published views, leases, endpoint choice), ``body`` (request validation),
``errors`` (typed errors and their HTTP answers), then the shell: ``auth`` (API keys, cluster token,
platform check), ``proxy`` (forwarding, retry-once, streaming relay), ``metrics``, ``settings``, ``service`` (the
:class:`~.service.Coordinator`), ``routes`` (thin handlers over it) and ``assembly`` (the apps: routers and
middleware); ``testing`` holds in-memory fakes. See ``docs/coordinator.md``.
"""
