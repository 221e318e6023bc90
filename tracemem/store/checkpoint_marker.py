"""A segment log's checkpoint marker: the LSN below which its records are applied, rewritten in place.

Why in place: the background writer checkpoints after every batch, and each file system call a
Python thread makes hands the GIL to the flow's thread and waits to get it back (~1.5 ms for the
writer, whose priority is lowered). Writing a new file and renaming it over the old one took four
such calls (open, write, close, rename); one `pwrite` into a file kept open takes one.

Why it is still safe: the marker is 12 bytes (the LSN and its CRC, `log_format.marker_bytes`)
at offset 0, inside one disk sector. A process crash leaves the old marker or the new one (a
write to the page cache happens whole or not at all). A marker torn by a power cut fails its CRC
and is reported, and the log then reads from its oldest segment: the records an older marker
lets through again are applied ones, which every applier skips (store/run_log.py `replay`).
An empty file is a marker never written (created just before a crash): no marker, no damage.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from .log_format import Damage, marker_bytes, parse_marker

__all__ = ["CheckpointMarker", "fsync_dir"]


class CheckpointMarker:
    """The `applied` file of a log directory; `writable` keeps it open for `write`."""

    def __init__(self, directory: Path, writable: bool) -> None:
        self.path = directory / "applied"
        self._fd = -1
        self._created = False  # made by this opening: its directory entry is synced with its first synced write
        if writable:
            self._created = not self.path.exists()
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)

    def read(self) -> tuple[int, Optional[Damage]]:
        """The LSN the marker holds (0: none yet), and the damage found instead of a valid marker."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return 0, None
        if not raw:
            return 0, None
        lsn = parse_marker(raw)
        if lsn is None:
            return 0, Damage(str(self.path), 0, 0, "unreadable checkpoint marker: reading from the oldest segment",
                             len(raw))
        return lsn, None

    def write(self, lsn: int, sync: bool) -> None:
        """Replace the marker with `lsn` (`sync`: durable before returning)."""
        if self._fd < 0:
            raise OSError(f"checkpoint marker {self.path} is not open for writing")
        os.pwrite(self._fd, marker_bytes(lsn), 0)
        if sync:
            os.fdatasync(self._fd)
            if self._created:  # once, not at every checkpoint
                fsync_dir(self.path.parent)
                self._created = False

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def fsync_dir(directory: Path) -> None:
    """Make the directory's entries (a file created, renamed or deleted in it) durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
