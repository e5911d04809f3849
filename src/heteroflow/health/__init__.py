"""GPU health: the five hardware error counters, their samples, and the rules that judge them.

Pure domain code: no web framework, database driver or HTTP client is imported here. Storage and
transport live in :mod:`heteroflow.storage` and :mod:`heteroflow.platform_server`.
"""
