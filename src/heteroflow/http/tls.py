"""One verifying TLS context per process for every outgoing HTTP client.

httpx builds a new ``ssl.SSLContext`` for each client it makes, reading the whole CA bundle every time (about
40 ms of CPU on a 2-core machine), even when the client only ever speaks plain HTTP on loopback. A client made
per short task (a proxied request, a readiness probe, an alert delivery) then costs more than its requests.
Every client in HeteroFlow passes ``verify=client_tls()`` instead: the same trust anchors httpx would choose
(``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` when ``trust_env``, else certifi's bundle), loaded once. An
``SSLContext`` is safe to share between connections and threads.
"""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache
def client_tls(*, trust_env: bool = True) -> ssl.SSLContext:
    """The process's verifying client context, made on first use with httpx's own rules."""
    return httpx.create_ssl_context(trust_env=trust_env)
