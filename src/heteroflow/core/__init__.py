"""Foundations every other package may import: the clock, lenient settings, identifiers, logging.

Nothing here imports a web framework, a database driver or an HTTP client.
"""
