"""Wire contracts below every layer: pydantic models and data only, importing nothing of HeteroFlow above it.

``engine_protocol`` is the vLLM fault-tolerance protocol in its two profiles (``engine-protocol.md``);
``heartbeat`` the agent ⇄ platform server wire (registration, heartbeat), whose hardware error counters (keys, bounds,
reading type) are ``counters``; ``hardware_events`` the platform
server's hardware-events feed that the serving controller polls; ``serving`` the NodeManager ⇄ controller ⇄
Coordinator wire; ``text`` which characters may travel in a name.
"""
