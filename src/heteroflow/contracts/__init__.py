"""Wire contracts below every layer: pydantic models and data only, importing nothing of HeteroFlow above it.

``engine_protocol`` is the vLLM fault-tolerance protocol in its two profiles (``engine-protocol.md``);
``heartbeat`` the agent ⇄ platform server wire (registration, heartbeat); ``text`` which characters may travel
in a name.
"""
