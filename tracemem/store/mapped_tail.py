"""The journal's active segment written through a shared memory map: an append without a system call.

Why: `os.pwrite` costs about a microsecond and releases the GIL, and in a busy process
each release can hand the interpreter to another thread (the store's background writer)
before the appending thread gets it back: per run of bench/overhead.py that was about
1 µs per stage. A store into a shared mapping of the file is a memory copy into the same
page-cache pages `pwrite` fills, so it promises the same: it survives the process dying
in any way (the kernel owns those pages and writes them back) and not a power loss or a
kernel crash. `fsync=True` logs keep `pwrite` + fdatasync (segment_log.py).

A store into a mapped page that the file system cannot back (disk full) kills the process
with SIGBUS, where a full disk must be an error. So every byte is reserved with
`posix_fallocate` (and zeros written there) before it is mapped to: ahead of the
writes, 64 KiB at first, doubling up to 1 MiB at a time, and a reservation that fails is the append's `OSError` (ENOSPC),
before anything was copied; on a file system that cannot reserve space at all, the
segment's appends go through `pwrite` instead.
The file is sized to the whole segment at once (sparse: only reserved blocks use disk),
since a mapping may not reach past the file's end; its zero tail is the preallocated
segment's clean end (log_format.py).
"""
from __future__ import annotations

import errno
import mmap
import os

RESERVE = 1 << 20  # bytes reserved on disk ahead of the writes, per posix_fallocate call, at most ...
FIRST_RESERVE = 64 << 10  # ... and at first: a store that records one run keeps 64 KiB, not a MiB
_ZEROS = bytes(RESERVE)


def can_map() -> bool:
    """Whether this platform can reserve disk space for a mapping (else segment_log keeps pwrite)."""
    return hasattr(os, "posix_fallocate")


class MappedTail:
    """Writes into the first `size` bytes of segment file `fd` (which it sizes to `size`). Bytes below
    `reserved` are allocated on disk already; those above it hold nothing yet (zeros are written there)."""

    def __init__(self, fd: int, size: int, reserved: int) -> None:
        if os.fstat(fd).st_size < size:
            os.ftruncate(fd, size)
        self.fd, self.size, self.reserved = fd, size, reserved
        self.usable = True
        self._map = mmap.mmap(fd, size)

    def write(self, offset: int, head: bytes, data: bytes) -> bool:
        """`head` then `data` at `offset`; False when the caller must write them with pwrite: a record the
        mapping cannot hold, or a file system that cannot reserve space (from then on). OSError: the disk
        is full."""
        middle = offset + len(head)
        end = middle + len(data)
        if end > self.size or not self.usable:
            return False
        if end > self.reserved:
            try:  # ahead by what is reserved already (doubling it) between FIRST_RESERVE and RESERVE
                ahead = min(RESERVE, max(FIRST_RESERVE, self.reserved))
                self._reserve(min(self.size, max(end, self.reserved + ahead)))
            except OSError as e:
                if e.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise
                self.usable = False  # (EOPNOTSUPP, EINVAL...): this segment's appends go through pwrite
                return False
        mapped = self._map
        mapped[offset:middle] = head
        mapped[middle:end] = data
        return True

    def _reserve(self, upto: int) -> None:
        """Allocate the blocks below `upto`, then write zeros into them: a page mapped onto a block that
        is allocated but never written costs a page fault the file system must convert (ext4: an
        extent change), about 1 µs per 2 kB appended; onto written zeros it is a plain memory copy."""
        size = upto - self.reserved
        os.posix_fallocate(self.fd, self.reserved, size)
        written = os.pwrite(self.fd, _ZEROS if size == RESERVE else bytes(size), self.reserved)
        if written != size:  # short only when the disk is full
            raise OSError(errno.ENOSPC, f"short write of zeros ({written} of {size} bytes): "
                                        f"{os.strerror(errno.ENOSPC)}")
        self.reserved = upto

    def close(self) -> None:
        self._map.close()
