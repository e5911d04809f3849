"""Files at rest readable by their owner only, whatever the process's umask.

Every tenant's data and the token hashes live in the platform's SQLite file, the FT runtime in the controller's:
with a umask of 022 they would be 0644 in 0755 folders, readable by every local user. A data folder is made
0700 and a data file 0600 when they are created (and tightened when they exist already). SQLite creates a
database's ``-wal``, ``-shm`` and ``-journal`` files with the database file's own permissions, so preparing the
database file before SQLite opens it covers its side files too; :func:`private_sqlite` tightens existing ones.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


def private_dir(path: Path, *, tighten: bool = False) -> Path:
    """``path`` (and missing parents) created as a folder only its owner may enter (0700, whatever the umask).
    An existing folder keeps its mode unless ``tighten`` (a folder that is ours alone, such as a data folder):
    a database put in the current folder must not close that folder to everyone else."""
    created = not path.exists()
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if created or tighten:
        with contextlib.suppress(OSError):  # a folder we do not own (a mounted volume's root) keeps its mode
            os.chmod(path, 0o700)
    return path


def private_file(path: Path, *, create_folder: bool = True) -> Path:
    """``path`` as a file only its owner may read or write (0600), created empty when missing; its folder is
    created (0700) when missing unless ``create_folder`` is false (then a missing folder is an OSError)."""
    if create_folder:
        private_dir(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    return path


def private_sqlite(path: Path, *, create_folder: bool = True) -> Path:
    """A SQLite database file, and any side files it has, owner-only before SQLite opens it."""
    private_file(path, create_folder=create_folder)
    for suffix in SQLITE_SIDE_FILES:
        side = path.with_name(path.name + suffix)
        with contextlib.suppress(FileNotFoundError):
            os.chmod(side, 0o600)
    return path
