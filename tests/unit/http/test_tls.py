"""The one client TLS context per process: made once, verifying, with httpx's own choice of trust anchors."""

from __future__ import annotations

import ssl

import httpx

from heteroflow.http.tls import client_tls


def test_one_context_per_process_and_it_verifies() -> None:
    context = client_tls()
    assert client_tls() is context
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname


def test_its_trust_anchors_are_the_ones_httpx_would_load_for_a_client_of_its_own() -> None:
    own = httpx.create_ssl_context()
    assert client_tls().cert_store_stats() == own.cert_store_stats()
    assert client_tls().cert_store_stats()["x509_ca"] > 0


def test_a_client_that_ignores_the_environment_gets_a_context_of_its_own() -> None:
    assert client_tls(trust_env=False) is not client_tls()
    assert client_tls(trust_env=False) is client_tls(trust_env=False)
    assert (
        client_tls(trust_env=False).cert_store_stats() == httpx.create_ssl_context(trust_env=False).cert_store_stats()
    )
