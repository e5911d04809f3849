"""The serving controller (``serving-ft.md``): so far only its pure core, :mod:`.core`."""
