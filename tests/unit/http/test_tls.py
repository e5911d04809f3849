"""The one client TLS context per process: made once, verifying, with httpx's own choice of trust anchors."""

from __future__ import annotations

import ast
import ssl
from pathlib import Path

import httpx

import heteroflow
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


_CLIENT_CALLS = {"AsyncClient", "Client", "get", "post", "put", "patch", "delete", "head", "request", "stream"}


def test_every_http_client_in_src_is_given_the_shared_context() -> None:
    """A client made without ``verify=client_tls(...)`` reads the CA bundle again; one that ignores the environment
    (``trust_env=False``) gets the context made with the same rule."""
    src = Path(heteroflow.__file__).parent
    wrong = []
    for path in sorted(src.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "httpx"
                and node.func.attr in _CLIENT_CALLS
            ):
                continue
            given = {keyword.arg: ast.unparse(keyword.value) for keyword in node.keywords}
            trust_env = given.get("trust_env", "True")
            expected = "client_tls()" if trust_env == "True" else f"client_tls(trust_env={trust_env})"
            if given.get("verify") != expected:
                wrong.append(f"{path.relative_to(src)}:{node.lineno}: verify={given.get('verify')}")
    assert not wrong, wrong
