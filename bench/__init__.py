"""Benchmarks: each module is a script (``python bench/<name>.py``), importable as ``bench.<name>``."""
