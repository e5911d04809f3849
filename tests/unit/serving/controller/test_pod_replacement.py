"""The pod replacement port: the Kubernetes implementation's translation of the API's answers, and the fake."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from heteroflow.serving.controller.pod_replacement import (
    KubernetesPodReplacement,
    PodReplacement,
    PodReplacementError,
)
from heteroflow.serving.controller.testing import RecordingPodReplacement


@dataclass
class CoreV1:
    """The one call of ``CoreV1Api`` the replacement makes; ``status``: the API's answer (200: deleted)."""

    status: int = 200
    calls: list[tuple[str, str]] = field(default_factory=list)

    def delete_namespaced_pod(self, name: str, namespace: str, **_: Any) -> None:
        self.calls.append((name, namespace))
        if self.status != 200:
            raise ApiException(status=self.status, reason="refused")


def kubernetes(api: CoreV1) -> KubernetesPodReplacement:
    replacement = KubernetesPodReplacement(namespace="heteroflow")
    replacement._core = api  # our own seam: the client the replacement would build from the kubeconfig
    return replacement


def test_a_pod_is_deleted_in_the_configured_namespace() -> None:
    api = CoreV1()
    asyncio.run(kubernetes(api).replace("moe-decode-1"))
    assert api.calls == [("moe-decode-1", "heteroflow")]


def test_a_pod_already_gone_is_no_error() -> None:
    api = CoreV1(status=404)
    asyncio.run(kubernetes(api).replace("moe-decode-1"))
    assert api.calls == [("moe-decode-1", "heteroflow")]


@pytest.mark.parametrize("status", [403, 500])
def test_a_refusal_is_a_replacement_error_the_fallback_retries(status: int) -> None:
    with pytest.raises(PodReplacementError, match=f"HTTP {status}"):
        asyncio.run(kubernetes(CoreV1(status=status)).replace("moe-decode-1"))


def test_the_fake_records_fails_as_told_and_runs_what_the_cluster_does() -> None:
    back: list[str] = []

    async def comes_back(pod_id: str) -> None:
        back.append(pod_id)

    fake: PodReplacement = RecordingPodReplacement(on_replace=comes_back, failures=1)
    with pytest.raises(PodReplacementError):
        asyncio.run(fake.replace("pod-b"))
    asyncio.run(fake.replace("pod-b"))
    assert isinstance(fake, RecordingPodReplacement)
    assert fake.replaced == ["pod-b"]
    assert back == ["pod-b"]
