"""The HTTP plumbing every service shares: below the services, above the domain.

- :mod:`.gate` — the cluster-token gate of the internal services (``Authorization: Bearer``) and the
  ``WWW-Authenticate`` challenge that goes with every 401.
- :mod:`.errors` — the ``{"error", "detail"}`` answer and one exception → status table per service.
- :mod:`.bodies` — a route's JSON body read into its pydantic model, on top of the one body-limit implementation
  (:mod:`heteroflow.core.request_body`).
- :mod:`.probes` — the liveness and readiness routes.
- :mod:`.peer` — one pooled JSON client per peer, whose errors say whether to retry (``Unavailable``) or not
  (``Rejected``).
- :mod:`.tls` — one verifying TLS context per process, handed to every HTTP client instead of one per client.
"""
