"""vLLM 0.34's external-LB elastic EP, the decisions of one rank: purely computational, no I/O.

What a resize is (all file:line references are to the vLLM 0.34.0 wheel):

- The request reaches every old rank's API (``entrypoints/serve/elastic_ep/api_router.py`` L86-87). A request for
  the current size returns at once, without an epoch (``v1/engine/async_llm.py`` L1327-1334).
- The target may not exceed ``--elastic-ep-max-dp-size`` (``distributed/elastic_ep/external_elastic_ep.py``
  L673-678), which defaults to the initial size (``config/parallel.py`` L1129-1138).
- Physical experts per rank stay fixed: the new redundancy is ``(E + R) * new // cur - E``; below 0 the scale is
  refused (``external_elastic_ep.py`` L246-262). Every rank checks it before rank 0 publishes anything (L679-684).
- Ranks are always ``range(new)``: a scale-up admits only ``range(cur, new)`` (L467-472), a scale-down retires
  ``dp_rank >= new`` (L528, L794-816; ``async_llm.py`` L1358-1362).
- Prepare: rank 0 publishes an epoch (``uuid4().hex``, L430) and the bootstrap; every rank of ``range(new)`` gets
  ready, and every old rank waits for all of them, 300 s (L481-515). Then the API gates serving (503), commit
  waits for every old rank (``commit_ready`` over ``range(cur)``, 600 s, L628-654), pauses its scheduler and
  switches. A retiring rank pauses with ``"abort"`` (L803-806). A remaining one pauses with ``"wait"`` (running
  requests step on and finish) when the fused MoE kernel cannot be reused, else with ``"keep"`` (running requests
  are kept without being stepped while the group switches; ``v1/engine/core_client.py`` L1692-1701,
  ``v1/engine/core.py`` L1026-1048). The simulator models ``"wait"`` only.
"""

from __future__ import annotations

from dataclasses import dataclass

from heteroflow.contracts.engine_protocol import elastic_ep_experts_text, elastic_ep_max_dp_size_text

PREPARE_TIMEOUT_SEC = 300.0
"""The ready barrier (``external_elastic_ep.py`` L488 ``timeout_s: float = 300``) and the bootstrap wait (L362)."""
COMMIT_TIMEOUT_SEC = 600.0
"""The commit barrier over the old ranks (``external_elastic_ep.py`` L629 ``timeout_s=600``)."""
SCALE_UP_HANDSHAKE_TIMEOUT_SEC = 300.0
"""A scale-up-launched rank waits this long for rank 0's handshake (``v1/engine/core.py`` L124
``HANDSHAKE_TIMEOUT_MINS = 5``, L1593)."""
SCALE_UP_LAUNCH_ENV = "VLLM_ELASTIC_EP_SCALE_UP_LAUNCH"
"""Set to ``1`` on a rank launched to join a scale-up (``v1/engine/core.py`` L1601-1617)."""


class ElasticEpRefusal(ValueError):
    """A resize refused before anything is published: HTTP 400 with vLLM's text."""


@dataclass(frozen=True, slots=True)
class Resize:
    """One rank's view of an accepted resize from ``cur`` to ``new`` data-parallel ranks."""

    rank: int
    cur: int
    new: int
    num_redundant_experts: int
    """The redundancy after the resize: ``(E + R) * new // cur - E``."""
    slots_per_rank: int
    """Physical experts per rank, unchanged by the resize: ``(E + R) // cur``."""

    @property
    def scale_up(self) -> bool:
        return self.new > self.cur

    @property
    def retires(self) -> bool:
        return retires(rank=self.rank, cur=self.cur, new=self.new)


def retires(*, rank: int, cur: int, new: int) -> bool:
    """``rank`` leaves the world: a scale-down retires ``dp_rank >= new`` (``async_llm.py`` L1358-1362,
    ``external_elastic_ep.py`` L528)."""
    return new < cur and rank >= new


def launched_ranks(*, cur: int, new: int) -> range:
    """The ranks a scale-up launches externally: only these may join (``external_elastic_ep.py`` L467-472)."""
    return range(cur, new)


def redundant_experts_after(*, num_experts: int, num_redundant_experts: int, cur: int, new: int) -> int:
    """The redundancy that keeps physical experts per rank fixed; :class:`ElasticEpRefusal` below 0."""
    after = (num_experts + num_redundant_experts) * new // cur - num_experts
    if after < 0:
        raise ElasticEpRefusal(elastic_ep_experts_text(cur_data_parallel_size=cur, new_data_parallel_size=new))
    return after


def plan_resize(
    *, rank: int, cur: int, new: int, num_experts: int, num_redundant_experts: int, max_dp_size: int
) -> Resize:
    """The resize this rank takes part in, checked in vLLM's order (max size, then the experts).

    ``new == cur`` is no resize (the caller answers at once); raises :class:`ElasticEpRefusal` with vLLM's text."""
    if new == cur:
        raise ValueError("a resize to the current size is no resize")
    if new > max_dp_size:
        raise ElasticEpRefusal(elastic_ep_max_dp_size_text(new_data_parallel_size=new, max_dp_size=max_dp_size))
    redundant = redundant_experts_after(
        num_experts=num_experts, num_redundant_experts=num_redundant_experts, cur=cur, new=new
    )
    return Resize(
        rank=rank,
        cur=cur,
        new=new,
        num_redundant_experts=redundant,
        slots_per_rank=(num_experts + num_redundant_experts) // cur,
    )


@dataclass(frozen=True, slots=True)
class ElasticEpConfig:
    """What one rank needs to take part in a resize (``--enable-elastic-ep``)."""

    num_experts: int
    num_redundant_experts: int
    """The launch redundancy; a scale-up-launched rank replaces it with rank 0's (``core.py`` L1613-1629)."""
    max_dp_size: int
    """``--elastic-ep-max-dp-size``: at least the launch size (``config/parallel.py`` L1129-1138)."""
    prepare_timeout_sec: float = PREPARE_TIMEOUT_SEC
    commit_timeout_sec: float = COMMIT_TIMEOUT_SEC
