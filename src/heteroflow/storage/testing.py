"""A real PostgreSQL server for tests, started from the Debian binaries in a private directory.

PostgreSQL refuses to run as root, so when the tests run as root the server runs as the ``postgres``
user (the Debian package creates it). The server listens on 127.0.0.1 on a free port and on a socket in
its own directory; :meth:`PostgresServer.stop` and :meth:`PostgresServer.start` let a test take the
database away and bring it back.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import sqlalchemy as sa

from heteroflow.core.testing import free_port


class PostgresUnavailableError(RuntimeError):
    """No PostgreSQL server binaries on this machine."""


def find_postgres_bin() -> Path:
    """The newest installed ``/usr/lib/postgresql/<version>/bin`` holding ``initdb`` and ``pg_ctl``."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parent.parent.name))
    if candidates:
        return Path(candidates[-1]).parent
    initdb = shutil.which("initdb")
    if initdb and shutil.which("pg_ctl"):
        return Path(initdb).resolve().parent
    raise PostgresUnavailableError("PostgreSQL server binaries not found (apt-get install postgresql)")


class PostgresServer:
    def __init__(self) -> None:
        self.bin_dir = find_postgres_bin()
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="hf-pg-"))
        self.data_dir = self.root / "data"
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            entry = pwd.getpwnam("postgres")
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self.root.chmod(0o700)
        self._run("initdb", "-D", str(self.data_dir), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8")
        self.running = False

    def _run(self, tool: str, *args: str) -> None:
        command = [str(self.bin_dir / tool), *args]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=120)  # noqa: S603 - our own paths

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data_dir), "-o", options, "-l", str(self.root / "log"), "-w", "start")
        self.running = True

    def stop(self) -> None:
        if self.running:
            self._run("pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "stop")
            self.running = False

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        """A new empty database; returns its URL."""
        name = f"t_{uuid.uuid4().hex[:12]}"
        engine = sa.create_engine(self.url().replace("postgresql://", "postgresql+psycopg://"))
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        engine.dispose()
        return self.url(name)

    def close(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
