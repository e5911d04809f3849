"""Every service against its own OpenAPI document, fuzzed by schemathesis in process.

For each operation of each service (platform server, controller, NodeManager, Coordinator, engine simulator)
schemathesis generates valid and invalid requests from the schema, sends them with the caller's legitimate
credentials, and checks that the answer is never a server error and is what the schema documents: a listed
status code, content type, headers and body schema. Generation is derandomized, so CI replays the same cases.

Each service runs in process with its own fakes (``tests/fuzz/services.py``); schemathesis drives it through its
ASGI transport, in the event loop that started it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import APIOperation, Case, GenerationMode
from schemathesis.core.result import Ok

from tests.fuzz.services import BUILDERS, Hosted

Operation = APIOperation[Any, Any, Any, Any]
"""An operation of whichever schema (the type arguments are schemathesis internals)."""

MAX_EXAMPLES = 20
"""Generated requests per operation and generation mode (valid, then invalid)."""

CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
)

EXPECTED_SERVER_ERRORS: dict[str, list[str]] = {
    # A guard held by another round, a stale round or an apply the engines refused is HTTP 502 by the RFC
    # ("another transaction owns this NodeManager"); the schema documents it on each route that answers it.
    "node_manager": ["502"],
    # A known model with no endpoint published (the fuzzer's own DEL withdraws them) is held for the client
    # deadline, then answered 503 with Retry-After (docs/coordinator.md, "Holding"); documented on both routes.
    "coordinator": ["503"],
}


def fuzz_config(service: str) -> schemathesis.Config:
    return schemathesis.Config.from_dict(
        {
            "warnings": False,
            "generation": {"deterministic": True, "database": "none"},
            "checks": {
                "enabled": False,
                **{name: {"enabled": True} for name in CHECKS},
                "not_a_server_error": {
                    "enabled": True,
                    "expected-statuses": ["2xx", "3xx", "4xx", *EXPECTED_SERVER_ERRORS.get(service, [])],
                },
            },
        }
    )


def fuzz_operation(operation: Operation, mode: GenerationMode, headers: dict[str, str]) -> int:
    """Send ``MAX_EXAMPLES`` generated requests of ``mode`` to ``operation``; the number sent."""
    sent = 0

    @settings(
        max_examples=MAX_EXAMPLES,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def fuzz(case: Case[Operation]) -> None:
        nonlocal sent
        sent += 1
        case.call_and_validate(headers=headers)

    fuzz()
    return sent


@pytest.mark.parametrize("service", list(BUILDERS))
def test_every_operation_answers_as_its_schema_documents(service: str, tmp_path: Path) -> None:
    hosted = Hosted(BUILDERS[service], tmp_path)
    # loading the schema starts the service (its lifespan); schemathesis ends it when the test ends
    schema = schemathesis.openapi.from_asgi("/openapi.json", hosted, config=fuzz_config(service))
    assert hosted.service is not None
    headers = hosted.service.headers
    failures: list[str] = []
    operations = sent = 0
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), f"an operation the schema does not describe validly: {result.err()}"
        operation = result.ok()
        operations += 1
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                sent += fuzz_operation(operation, mode, headers)
            except Unsatisfiable:
                # every request the schema allows is valid (no parameter, or a free string): nothing negative
                assert mode is GenerationMode.NEGATIVE, operation.label
            except (Exception, BaseExceptionGroup) as exc:  # every operation is fuzzed, all violations reported
                failures.append(f"{operation.label} ({mode.value}): {type(exc).__name__}: {exc}")
    print(f"{service}: {operations} operations, {sent} requests")  # shown with -s / -rP
    assert operations > 0
    assert not failures, "\n\n".join(failures)
