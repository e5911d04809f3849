"""Having a pod deleted for replacement: the one Kubernetes write the controller makes (``core/relaunch.py``).

A rank whose card has a standing hardware fault is never relaunched on that card. On Kubernetes its pod is
deleted: the StatefulSet creates it again under the same name, and the scheduler places it on cards the device
plugin still offers (it withdraws a faulty one), so the pod's NodeManager registers again with other cards.

:class:`PodReplacement` is the port; :class:`KubernetesPodReplacement` the real one (the official client,
in-cluster configuration or a kubeconfig, as the ResourceMonitor's watch); the in-memory fake is
:class:`heteroflow.serving.controller.testing.RecordingPodReplacement`. Without one (a local cluster) the
controller cannot replace a pod, and an instance comes back without such ranks instead.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol


class PodReplacementError(Exception):
    """The pod could not be deleted (the API refused or did not answer); the fallback retries after its back-off."""


class PodReplacement(Protocol):
    async def replace(self, pod_id: str) -> None:
        """Delete pod ``pod_id`` so that its controller creates it again; a pod already gone is no error.
        Raises :class:`PodReplacementError`."""
        ...


class KubernetesPodReplacement:
    """Deletes pods of ``namespace`` through the Kubernetes API (RBAC: ``delete`` on ``pods`` in it)."""

    def __init__(self, *, namespace: str, kubeconfig: str | None = None, timeout_sec: float = 10.0) -> None:
        self._namespace = namespace
        self._kubeconfig = kubeconfig
        self._timeout_sec = timeout_sec
        self._core: Any = None

    def _api(self) -> Any:
        if self._core is None:
            from kubernetes import client
            from kubernetes import config as kube_config

            config: Any = kube_config  # the client's loaders are untyped
            if self._kubeconfig:
                config.load_kube_config(config_file=self._kubeconfig)
            else:
                try:
                    config.load_incluster_config()
                except config.ConfigException:
                    config.load_kube_config()
            self._core = client.CoreV1Api()
        return self._core

    def _delete(self, pod_id: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self._api().delete_namespaced_pod(pod_id, self._namespace, _request_timeout=self._timeout_sec)
        except ApiException as exc:
            if exc.status == 404:  # already gone: its StatefulSet is creating it again
                return
            raise PodReplacementError(f"deleting pod {pod_id!r}: HTTP {exc.status} {exc.reason}") from exc
        except Exception as exc:  # a configuration or transport error of the client
            raise PodReplacementError(f"deleting pod {pod_id!r}: {type(exc).__name__}: {exc}") from exc

    async def replace(self, pod_id: str) -> None:
        await asyncio.to_thread(self._delete, pod_id)  # the official client blocks
