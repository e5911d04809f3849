"""The platform both halves stand on: tokens, scopes and tenants; nodes and their liveness.

Pure domain code and small async loops over store interfaces; no web framework or database driver.
"""
