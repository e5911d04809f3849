"""In-memory fakes of the controller's outside systems, for tests."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from heteroflow.serving.controller.pod_replacement import PodReplacementError


@dataclass
class RecordingPodReplacement:
    """A :class:`~heteroflow.serving.controller.pod_replacement.PodReplacement` that records each deletion and
    then runs ``on_replace`` (what the cluster would do: the pod comes back, maybe on other cards).
    ``failures``: how many deletions fail first, with :class:`PodReplacementError`."""

    on_replace: Callable[[str], Awaitable[None]] | None = None
    failures: int = 0
    replaced: list[str] = field(default_factory=list)

    async def replace(self, pod_id: str) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise PodReplacementError(f"deleting pod {pod_id!r}: refused (injected)")
        self.replaced.append(pod_id)
        if self.on_replace is not None:
            await self.on_replace(pod_id)
