"""The node agent: collects GPU telemetry and health counters and beats them to the platform server.

Layout (pure core first, thin shell last):

- ``readings``: the frozen values every collector returns (per-GPU telemetry and health counters).
- ``parsing``: vendor text → counters; never raises, unknown is ``None`` and never 0 (H-1).
- ``nvidia_smi``, ``xpu_smi``, ``cnmon``: pure parsers plus one small collector class each, running the
  tool through the :class:`~heteroflow.agent.commands.CommandRunner` seam.
- ``nvml``: the in-process NVML collector and the XID event watcher, through the ``NvmlApi`` seam (the
  only module that imports ``pynvml``, lazily).
- ``collectors``: the collector interface and the auto-selection (NVML, then nvidia-smi, then xpu-smi,
  then cnmon).
- ``freshness``, ``xid_queue``, ``heartbeat``: pure decisions — what a beat may still report, which XID
  events wait for the server, and the wire payload.
- ``scheduler``: the background collection loops with a per-tick timeout (a hung tool never delays a beat).
- ``client``: the platform API over HTTP (the only module that imports ``httpx``).
- ``runner``: registration, the heartbeat loop, reconnect backoff and the frozen :class:`AgentStatus`.
- ``simulated``: simulated cards for a platform without hardware (source ``simulated``, H-17).
- ``testing``: fakes of every seam above, for this project's tests and its users'.
"""
