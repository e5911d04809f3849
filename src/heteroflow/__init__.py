"""HeteroFlow: keeps large GPU/NPU inference fleets serving through hardware faults."""

__version__ = "0.1.0"
