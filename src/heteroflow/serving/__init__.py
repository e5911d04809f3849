"""Serving fault tolerance (``serving-ft.md``): the NodeManager, and the wire contract it shares with the controller."""
