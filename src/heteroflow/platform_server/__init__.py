"""The platform server: FastAPI routes over the platform and health services, and the shell that wires
stores, background tasks and metrics together."""
