"""The ``heteroflow`` command (typer): server, admin, db and the local cluster."""
