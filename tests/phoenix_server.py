"""A real Arize Phoenix server on 127.0.0.1, run from a virtualenv of its own, for the slow test and the screenshot.

Phoenix is heavy (a few hundred MB of dependencies), so it is not one of tracemem's extras: `make phoenix`
(which `.ci/run` calls) installs `arize-phoenix` and its client into `.venv-phoenix/`, or
`TRACEMEM_PHOENIX_PYTHON` names another interpreter that has them. The server keeps its data in a
temporary folder, binds 127.0.0.1 only, on free ports, with its telemetry and external resources off, and
is asked through its own client (tests/phoenix_query.py, run by that interpreter) what it holds.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

ROOT = Path(__file__).resolve().parents[1]
PYTHON = os.environ.get("TRACEMEM_PHOENIX_PYTHON", str(ROOT / ".venv-phoenix" / "bin" / "python"))


def missing_phoenix() -> Optional[str]:
    """Why Phoenix cannot be started here (None when it can)."""
    if not os.path.exists(PYTHON):
        return f"no Phoenix interpreter at {PYTHON}: run `make phoenix` (.ci/run does) or set TRACEMEM_PHOENIX_PYTHON"
    found = subprocess.run([PYTHON, "-c", "import phoenix, phoenix.client"], capture_output=True, text=True)
    if found.returncode != 0:
        return f"{PYTHON} cannot import phoenix and phoenix.client: {found.stderr.strip().splitlines()[-1:]}"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Phoenix:
    """A started server: `url` (its web UI and API), `traces_url` (where OTLP over HTTP goes)."""

    def __init__(self, url: str, process: subprocess.Popen, log: Path) -> None:
        self.url = url
        self.traces_url = f"{url}/v1/traces"
        self.process = process
        self.log = log

    def query(self, project: str) -> dict[str, Any]:
        """The project's spans and sessions, as its client reports them (tests/phoenix_query.py)."""
        done = subprocess.run([PYTHON, str(ROOT / "tests" / "phoenix_query.py"), self.url, project],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"querying Phoenix failed: {done.stderr[-2000:]}")
        return json.loads(done.stdout)


@contextmanager
def phoenix(timeout: float = 180.0) -> Iterator[Phoenix]:
    """Start Phoenix, wait until it answers, and stop it afterwards (its data folder removed)."""
    work = Path(tempfile.mkdtemp(prefix="tracemem-phoenix-"))
    port, grpc = _free_port(), _free_port()
    env = {**os.environ, "PHOENIX_WORKING_DIR": str(work), "PHOENIX_HOST": "127.0.0.1", "PHOENIX_PORT": str(port),
           "PHOENIX_GRPC_PORT": str(grpc), "PHOENIX_TELEMETRY_ENABLED": "false",
           "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false", "PHOENIX_DISABLE_AGENT_ASSISTANT": "true"}
    log = work / "phoenix.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([PYTHON, "-m", "phoenix.server.main", "serve"], env=env, stdout=out,
                                   stderr=subprocess.STDOUT, cwd=work)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"Phoenix exited ({process.returncode}):\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"Phoenix did not answer within {timeout:.0f} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield Phoenix(url, process, log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(work, ignore_errors=True)
