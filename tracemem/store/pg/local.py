"""A throwaway local PostgreSQL server in a directory: for tests, benchmarks and trying the fleet
backend on one machine.

Why here and not in tests/: the benchmark and the README's "two workers" commands need the same
server the tests use, started the same way. It finds server binaries in this order: the directory
`$TRACEMEM_PG_BIN`, the `pgserver` package (PostgreSQL 16 with pgvector, from PyPI, installed by
`make install`), then a system install (`/usr/lib/postgresql/*/bin`, or `initdb` on PATH).

PostgreSQL refuses to run as root. Run as root (as CI is), the server runs as the unprivileged
user `nobody`, so its directory must be one `nobody` can reach (e.g. made by `tempfile.mkdtemp(dir=
"/tmp")`); when that user cannot reach the binaries (a virtualenv under /root), they are copied
into the server's directory first.

    server = LocalServer.start("/tmp/pg")          # initdb + start on a free 127.0.0.1 port
    store = Store(server.url("tracemem"))          # creates the database on first use
    server.stop()

or from a shell: `python -m tracemem.store.pg.local start /tmp/pg` (prints the URL), then `stop`.
"""
from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Optional

from ...errors import TracememError

__all__ = ["LocalServer", "ServerUnavailable", "find_binaries"]


class ServerUnavailable(TracememError):
    """No PostgreSQL server binaries here, or the server would not start; the message says why."""


def find_binaries() -> str:
    """The directory holding initdb, pg_ctl and postgres (see the module docstring for the order)."""
    candidates = [os.environ.get("TRACEMEM_PG_BIN", "")]
    spec = importlib.util.find_spec("pgserver")  # its folder only: importing it has side effects
    if spec is not None and spec.origin:
        candidates.append(os.path.join(os.path.dirname(spec.origin), "pginstall", "bin"))
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version, reverse=True)
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(os.path.dirname(os.path.realpath(on_path)))
    for folder in candidates:
        if folder and all(os.path.exists(os.path.join(folder, b)) for b in ("initdb", "pg_ctl", "postgres")):
            return folder
    raise ServerUnavailable(
        "no PostgreSQL server binaries found: pip install pgserver (PostgreSQL 16 with pgvector; "
        "`make install` does), or apt-get install postgresql, or set TRACEMEM_PG_BIN to a folder holding "
        "initdb, pg_ctl and postgres")


def _version(path: str) -> float:
    try:
        return float(path.rstrip("/").split("/")[-2])
    except ValueError:
        return 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LocalServer:
    """A server started by `LocalServer.start`: its directory, port and binaries."""

    directory: str
    port: int
    bin: str
    user: Optional[str]  # the OS user it runs as (None: this process's user)

    @classmethod
    def start(cls, directory: str, *, port: Optional[int] = None, durable: bool = False,
              max_connections: int = 200) -> "LocalServer":
        """initdb (once) and start a server listening on 127.0.0.1:`port` and a socket in `directory`.
        `durable=False` turns fsync off (tests); benchmarks pass True to measure real commits."""
        os.makedirs(directory, exist_ok=True)
        directory = os.path.abspath(directory)
        user = "nobody" if os.geteuid() == 0 else None
        binaries = find_binaries()
        if user is not None:
            _chown_tree(directory, user)
            binaries = _reachable(binaries, directory, user)
        server = cls(directory, port or free_port(), binaries, user)
        data = os.path.join(directory, "data")
        if not os.path.exists(os.path.join(data, "PG_VERSION")):
            server._run("initdb", "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync")
        options = ["-c listen_addresses=127.0.0.1", f"-k {directory}", f"-c max_connections={max_connections}",
                   "-c shared_buffers=128MB"]
        if not durable:
            options += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
        try:
            server._start(data, options)
        except ServerUnavailable as err:
            if port is not None or "already in use" not in str(err):
                raise
            server = cls(directory, free_port(), binaries, user)  # another process bound the free port first
            server._start(data, options)
        return server

    def _start(self, data: str, options: list[str]) -> None:
        self._run("pg_ctl", "-D", data, "-l", os.path.join(self.directory, "server.log"), "-w", "-t", "60",
                  "-o", " ".join([f"-p {self.port}", *options]), "start")

    def url(self, database: str = "postgres") -> str:
        """A connection URL for `database` (created on first use by `ensure_database`)."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def ensure_database(self, database: str) -> str:
        """Create `database` if it does not exist; returns its URL."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as con:
            if con.execute("SELECT 1 FROM pg_database WHERE datname = %s", [database]).fetchone() is None:
                con.execute(f'CREATE DATABASE "{database}"')
        return self.url(database)

    def stop(self) -> None:
        """Stop the server (immediately: its data is throwaway)."""
        self._run("pg_ctl", "-D", os.path.join(self.directory, "data"), "-m", "immediate", "-w", "stop",
                  check=False)

    def _run(self, binary: str, *args: str, check: bool = True) -> None:
        done = subprocess.run([os.path.join(self.bin, binary), *args], user=self.user, cwd=self.directory,
                              capture_output=True, text=True, timeout=120)
        if check and done.returncode != 0:
            log = os.path.join(self.directory, "server.log")
            tail = open(log).read()[-1500:] if os.path.exists(log) else ""
            raise ServerUnavailable(f"{binary} failed (exit {done.returncode}): {done.stderr.strip()[-1500:]}"
                                    f"{(' | server log: ' + tail) if tail else ''}")


def _chown_tree(directory: str, user: str) -> None:
    import pwd

    entry = pwd.getpwnam(user)
    for root, dirs, files in os.walk(directory):
        for name in [root] + [os.path.join(root, n) for n in dirs + files]:
            os.chown(name, entry.pw_uid, entry.pw_gid)


def _reachable(binaries: str, directory: str, user: str) -> str:
    """`binaries`, or a copy of their install tree inside `directory` when `user` cannot run them."""
    try:
        if subprocess.run([os.path.join(binaries, "postgres"), "--version"], user=user,
                          capture_output=True).returncode == 0:
            return binaries
    except OSError:  # the user may not even reach the folder
        pass
    install = os.path.dirname(binaries)  # e.g. site-packages/pgserver/pginstall
    package = os.path.dirname(install)
    libs = package + ".libs"  # a wheel's bundled libraries, found by the binaries' relative RPATH
    copy = os.path.join(directory, "install", os.path.basename(package))
    if not os.path.exists(copy):
        shutil.copytree(install, os.path.join(copy, os.path.basename(install)), symlinks=True)
        if os.path.isdir(libs):
            shutil.copytree(libs, os.path.join(directory, "install", os.path.basename(libs)), symlinks=True)
        _chown_tree(os.path.join(directory, "install"), user)
    return os.path.join(copy, os.path.basename(install), "bin")


def main(argv: list[str]) -> int:
    """`python -m tracemem.store.pg.local start DIR [PORT]` prints a URL; `stop DIR` stops it."""
    if len(argv) < 2 or argv[0] not in ("start", "stop"):
        print("usage: python -m tracemem.store.pg.local start DIR [PORT] | stop DIR", file=sys.stderr)
        return 2
    directory = os.path.abspath(argv[1])
    if argv[0] == "start":
        server = LocalServer.start(directory, port=int(argv[2]) if len(argv) > 2 else None, durable=True)
        with open(os.path.join(directory, "port"), "w") as f:
            f.write(str(server.port))
        print(server.ensure_database("tracemem"))
        return 0
    port = int(open(os.path.join(directory, "port")).read())
    user = "nobody" if os.geteuid() == 0 else None
    copied = glob.glob(os.path.join(directory, "install", "*", "*", "bin"))
    LocalServer(directory, port, copied[0] if copied else find_binaries(), user).stop()
    time.sleep(0.1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
