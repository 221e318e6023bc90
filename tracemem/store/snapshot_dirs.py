"""The folders snapshot copies live in: each names the process that made it, so a copy left behind by a
process that died (SIGKILL, a power cut) is removed by the next one that takes a snapshot.

Why: a snapshot copy is the whole store and its WAL, in the temporary directory. Its Store removes it
on close, at exit, or when garbage collected, but a killed process runs none of that, and a viewer or
a CLI reading a busy store every few seconds would fill the disk over days. The owner file holds the
process id and its start time (Linux: /proc; elsewhere the id alone), so a reused id is not taken for
the same process.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Optional

__all__ = ["PREFIX", "clean_stale", "make_snapshot_dir"]

PREFIX = "tracemem-snapshot-"
OWNER = "owner"
GRACE = 60.0  # seconds a folder without an owner file is left alone (being made, or from an older version)


def _started(pid: int) -> Optional[str]:
    """When process `pid` started (clock ticks since boot), where the system says; None when unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int, started: str) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        pass
    now = _started(pid)
    return now is None or started in ("", now)


def make_snapshot_dir() -> str:
    """A new folder for one snapshot copy, marked as this process's."""
    folder = tempfile.mkdtemp(prefix=PREFIX)
    with open(os.path.join(folder, OWNER), "w") as f:
        f.write(f"{os.getpid()} {_started(os.getpid()) or ''}")
    return folder


def clean_stale(directory: Optional[str] = None) -> list[str]:
    """Remove the snapshot folders in `directory` (the temporary directory) whose process is gone; the
    folders removed."""
    directory = directory or tempfile.gettempdir()
    removed = []
    try:
        names = [n for n in os.listdir(directory) if n.startswith(PREFIX)]
    except OSError:
        return []
    for name in names:
        folder = os.path.join(directory, name)
        try:
            with open(os.path.join(folder, OWNER)) as f:
                pid_text, _, started = f.read().partition(" ")
            stale = not _alive(int(pid_text), started.strip())
        except FileNotFoundError:
            try:
                stale = time.time() - os.stat(folder).st_mtime > GRACE
            except OSError:
                continue
        except (OSError, ValueError):
            continue
        if stale:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed
