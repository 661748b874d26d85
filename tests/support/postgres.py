"""A throwaway PostgreSQL server for the history's tests: the distribution's binaries, a cluster in a
temporary folder, trust authentication on a loopback port (a password for the roles `create_login`
makes), stopped (and its folder removed) afterwards.

PostgreSQL refuses to run as root, so as root the cluster belongs to the `postgres` user the Debian
package creates. Missing binaries fail the test with the install hint; they are never a skip.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
import psycopg.sql
import pytest

from cache_qualify.lab.control import free_port

INSTALL_HINT = "install PostgreSQL from the distribution: apt-get install -y postgresql"
SUPERUSER = "qualify"
PASSWORD_ROLE = "password_login"  # its members log in with a password (scram-sha-256), every other role is trusted


def binaries() -> Path:
    """The newest installed PostgreSQL's bin folder (Debian keeps it off PATH)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(Path(p).parts[-3]))
    if not found:
        pytest.fail(f"PostgreSQL's pg_ctl is not installed; {INSTALL_HINT}", pytrace=False)
    return Path(found[-1]).parent


@dataclass(frozen=True)
class Postgres:
    port: int

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """A new empty database; its SQLAlchemy URL."""
        with psycopg.connect(host="127.0.0.1", port=self.port, user=SUPERUSER, dbname="postgres",
                             autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')  # a name the test chose, not input
        return self.url(name)

    def create_login(self, user: str, password: str) -> str:
        """A role that logs in with `password` only, and a database of its own; its SQLAlchemy URL (with
        the password, as a lab engineer types it)."""
        with psycopg.connect(host="127.0.0.1", port=self.port, user=SUPERUSER, dbname="postgres",
                             autocommit=True) as conn:
            if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (PASSWORD_ROLE,)).fetchone() is None:
                conn.execute(f'CREATE ROLE "{PASSWORD_ROLE}" NOLOGIN')
            conn.execute(psycopg.sql.SQL("CREATE ROLE {} LOGIN PASSWORD {} IN ROLE {}").format(
                psycopg.sql.Identifier(user), psycopg.sql.Literal(password), psycopg.sql.Identifier(PASSWORD_ROLE)))
            conn.execute(psycopg.sql.SQL("CREATE DATABASE {} OWNER {}").format(
                psycopg.sql.Identifier(user), psycopg.sql.Identifier(user)))
        return f"postgresql://{user}:{password}@127.0.0.1:{self.port}/{user}"


def _as_owner(args: list[str], owner: str | None) -> list[str]:
    return ["runuser", "-u", owner, "--", *args] if owner else args


@contextmanager
def postgres_server() -> Iterator[Postgres]:
    """Start a cluster on 127.0.0.1 and a free port; stop it and remove its folder on the way out."""
    bin_dir = binaries()
    owner = None
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            pytest.fail(f"running as root needs the `postgres` user to own the cluster; {INSTALL_HINT}",
                        pytrace=False)
        owner = "postgres"
    folder = Path(tempfile.mkdtemp(prefix="cq-postgres-"))
    if owner:
        shutil.chown(folder, user=owner)
    data, log = folder / "data", folder / "server.log"
    port = free_port(["127.0.0.1"])

    def run(*args: object) -> None:
        subprocess.run(_as_owner([str(a) for a in args], owner), check=True, capture_output=True, text=True,
                       timeout=120)

    try:
        try:
            run(bin_dir / "initdb", "-D", data, "-A", "trust", "-U", SUPERUSER, "--no-sync")
            rules = data / "pg_hba.conf"  # the first matching line decides: password roles first
            rules.write_text(f"host all +{PASSWORD_ROLE} 127.0.0.1/32 scram-sha-256\n" + rules.read_text())
            run(bin_dir / "pg_ctl", "-D", data, "-l", log, "-w", "-t", "60", "-o",
                f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off", "start")
        except subprocess.CalledProcessError as exc:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            pytest.fail(f"PostgreSQL did not start: {exc.stderr or exc.stdout}\n{tail}", pytrace=False)
        yield Postgres(port)
    finally:
        if (data / "postmaster.pid").exists():
            subprocess.run(_as_owner([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"], owner),
                           capture_output=True, timeout=60)
        shutil.rmtree(folder, ignore_errors=True)
