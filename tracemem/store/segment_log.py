"""An append-only log of checksummed records beside a store: durability at the price of a write().

Why: a DuckDB commit costs 300–600 µs here whatever it holds; an append costs a memory copy
into a shared mapping of the file (mapped_tail.py) or, with `fsync`, one `pwrite` and an
fdatasync. The store folds the log into its tables later, and replays it on the next open.

What each level survives:
- `append()` returns once the record is in the kernel's page cache: it survives the
  process dying in any way (SIGKILL, OOM killer, segfault, `os._exit`), a record cut
  short by the death being a torn tail the checksum catches; not power loss or a
  kernel crash (unsynced records vanish or leave a torn tail; earlier ones stay).
- `sync()` (fdatasync, which on Linux also writes back the mapping's pages) makes every
  record appended before it power-loss safe. Threads calling it at once share one
  fdatasync (group commit). `SegmentLog(..., fsync=True)` syncs inside every `append()`.

On disk, `journal_dir("agent.duckdb")` (`agent.duckdb.journal/`) holds segments (16 MiB; a new one
starts when a record does not fit), a checkpoint marker and a lock file (`log_format`: the bytes).

Recovery protocol (idempotent, so a crash during recovery is safe):
1. `read()` yields the records after the marker, each with its `lsn` and `end`. A torn
   or corrupt record (bad checksum, truncated, zeros where a header belongs) ends its
   segment's records and is reported as a `Damage`, never returned: nothing after it
   in that segment is trusted, since its framing cannot be.
2. The caller applies the records, then calls `checkpoint(upto)`: the marker is
   written, and segments wholly below it are deleted. Nothing is deleted before.
3. A crash between applying and `checkpoint` replays those records on the next open
   (at-least-once). The applier de-duplicates on keys its records carry (run id and
   step), or stores the `end` of the last applied record with its data and reads with
   `read(after=that)` (exactly-once).
Opening a log whose last segment has a damaged tail leaves that segment as it is
(reported in `opening_damage`) and appends to a new one, so LSNs never repeat.
"""
from __future__ import annotations

import errno
import os
import threading
import zlib
from pathlib import Path
from typing import Iterator, NamedTuple, Optional, Sequence, Union

from .log_format import (FLAG_PREALLOCATED, RECORD_HEADER, RECORD_STRUCT, SEGMENT_HEADER, Damage, JournalError,
                         JournalLockedError, Record, frame, read_segment, segment_header, segment_name, take_lock)
from .checkpoint_marker import CheckpointMarker, fsync_dir
from .mapped_tail import MappedTail, can_map

_pack, _crc32 = RECORD_STRUCT.pack, zlib.crc32


class LogRead(NamedTuple):
    """What `SegmentLog.read` found."""

    records: list[Record]
    damage: list[Damage]
    upto: int  # pass to checkpoint() once `records` are applied: it also releases damaged segments


class Segment(NamedTuple):
    start: int
    path: Path


class SegmentLog:
    """The log in directory `path`; one writing process at a time (see the module docstring).

    `fsync`: fdatasync inside every append (power-loss safe per record). `preallocate`:
    allocate each segment at `segment_bytes` when created (default: same as `fsync`). `mapped`:
    append through a shared mapping (default: without `fsync`, where the platform can reserve space).
    `readonly`: read without taking the lock (a log being written may show a torn tail).
    """

    def __init__(self, path: Union[str, Path], *, fsync: bool = False, preallocate: Optional[bool] = None,
                 mapped: Optional[bool] = None, segment_bytes: int = 16 << 20, max_record: int = 64 << 20,
                 readonly: bool = False) -> None:
        if segment_bytes < SEGMENT_HEADER + RECORD_HEADER + 1:
            raise JournalError(f"segment_bytes={segment_bytes} is too small for one record; use at least 4096")
        self.path = Path(path)
        self.fsync = fsync
        self.preallocate = fsync if preallocate is None else preallocate
        self.mapped = (not fsync and can_map()) if mapped is None else mapped
        self._tail: Optional[MappedTail] = None  # the active segment's mapping (`mapped`)
        self.segment_bytes, self.max_record, self.readonly = segment_bytes, max_record, readonly
        self.opening_damage: list[Damage] = []
        self._lock = threading.Lock()  # appends, rotation, checkpoint (its bookkeeping, never its file I/O)
        self._checkpoint_lock = threading.Lock()  # one checkpoint at a time (their marker file is one)
        self._sync_cond = threading.Condition()
        self._syncing = False
        self._synced = 0
        self._broken: Optional[str] = None
        self._fd = self._lock_fd = -1
        self._start = self._offset = self._limit = 0  # the active segment: first LSN, write offset, size
        self._prealloc = False
        if readonly:
            self._broken = f"journal {self.path} was opened readonly: it cannot be written"
            if not self.path.is_dir():
                raise JournalError(f"no journal at {self.path}: nothing to read")
        else:
            self.path.mkdir(parents=True, exist_ok=True)
            self._lock_fd = take_lock(self.path)
        self._marker = CheckpointMarker(self.path, writable=not readonly)
        self.applied, damage = self._marker.read()
        self.opening_damage += [damage] if damage else []
        self._segments = self._list_segments()
        if not readonly:
            self._open_tail()

    # -- opening -----------------------------------------------------------------------------

    def _list_segments(self) -> list[Segment]:
        segments = []
        for p in self.path.glob("*.seg"):
            try:
                segments.append(Segment(int(p.stem, 16), p))
            except ValueError:
                self.opening_damage.append(Damage(str(p), 0, 0, "not a segment name: ignored", 0))
        return sorted(segments)

    def _open_tail(self) -> None:
        """Continue the last segment if it ends cleanly, else start a new one after it."""
        if not self._segments:
            self._create(self.applied)
            return
        last = self._segments[-1]
        raw = last.path.read_bytes()
        if raw.count(0) == len(raw):  # died while creating it (before its header): it never held anything
            last.path.unlink()
            self._segments.pop()
            self._create(max(last.start, self.applied))
            return
        _, end, damage = read_segment(last.path, last.start, None, None, self.max_record)
        if damage is None and end < self.applied:
            damage = Damage(str(self.path / "applied"), self.applied, 0, "the checkpoint marker is past the "
                            "last record: appending after it", 0)
        if damage is not None:
            self.opening_damage.append(damage)
            self._create(max(end, self.applied))
            return
        size = last.path.stat().st_size
        self._synced = end  # what an earlier process left is treated as written back
        if self.mapped and size <= end - last.start:  # appended without a zero tail: a mapping would add one
            self._create(end)
            return
        self._fd, self._start = os.open(last.path, os.O_RDWR), last.start
        self._offset = end - last.start
        self._prealloc = size > self._offset  # a clean end before the file's end: preallocated zeros
        self._limit = max(size, self.segment_bytes)
        if self.mapped:
            self._tail = MappedTail(self._fd, self._limit, self._offset)

    def _create(self, start: int) -> None:
        """A new active segment starting at LSN `start` (caller holds the lock or is opening)."""
        path = self.path / segment_name(start)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        tail = None
        try:
            flags, reserved = 0, SEGMENT_HEADER  # (a mapping never writes below `reserved`)
            if self.preallocate and hasattr(os, "posix_fallocate"):
                try:
                    os.posix_fallocate(fd, 0, self.segment_bytes)
                    flags, reserved = FLAG_PREALLOCATED, self.segment_bytes
                except OSError:  # a file system without fallocate: plain appends
                    pass
            if self.mapped:
                flags = FLAG_PREALLOCATED  # its zero tail is a clean end, as a preallocated segment's
            os.pwrite(fd, segment_header(start, flags), 0)
            if self.mapped:
                tail = MappedTail(fd, self.segment_bytes, reserved)
            if self.fsync:  # without fsync nothing promises to outlive a power loss, so opening stays cheap
                os.fsync(fd)
                fsync_dir(self.path)
        except BaseException:
            if tail is not None:
                tail.close()
            os.close(fd)
            raise
        self._tail = tail
        self._fd, self._start, self._offset, self._prealloc = fd, start, SEGMENT_HEADER, bool(flags)
        self._limit = self.segment_bytes
        self._segments.append(Segment(start, path))
        if self.fsync:  # (a segment written before, unsynced, is not: `sync()` writes it back)
            with self._sync_cond:
                self._synced = max(self._synced, start + SEGMENT_HEADER)

    def _close_tail(self) -> None:
        if self._tail is not None:
            self._tail.close()
            self._tail = None

    # -- writing -----------------------------------------------------------------------------

    @property
    def end(self) -> int:
        """The LSN the next record gets (everything below it has been appended)."""
        return self._start + self._offset

    def append(self, data: bytes, sync: bool = True) -> int:
        """Write one record; returns its `end` LSN. Process-crash safe on return (and
        power-loss safe with `fsync=True`, unless `sync=False`: the next synced append covers it)."""
        n = len(data)
        if not 0 < n <= self.max_record:
            raise JournalError(f"a journal record must hold 1 to {self.max_record} bytes, got {n}")
        return self._write(_pack(n, _crc32(data, n)), data, sync)  # frame(data), inlined: the hot path

    def append_many(self, records: Sequence[bytes]) -> int:
        """Write records with one write call (all or, after a crash, a valid prefix); returns the end LSN."""
        for data in records:
            if not 0 < len(data) <= self.max_record:
                raise JournalError(f"a journal record must hold 1 to {self.max_record} bytes, got {len(data)}")
        return self._write(b"", b"".join([frame(d) for d in records])) if records else self.end

    def _write(self, head: bytes, data: bytes, sync: bool = True) -> int:
        size = len(head) + len(data)
        with self._lock:
            if self._broken:
                raise JournalError(self._broken)
            offset = self._offset
            if offset + size > self._limit and offset > SEGMENT_HEADER:
                self._rotate()
                offset = self._offset
            written = 0  # bytes a failed append may have left (a mapped one fails before copying any)
            try:
                if self._tail is None or not self._tail.write(offset, head, data):
                    written = os.pwrite(self._fd, head + data, offset)
                    if written != size:  # a regular file writes short only when its disk is full
                        raise OSError(errno.ENOSPC, f"short write ({written} of {size} bytes): "
                                                    f"{os.strerror(errno.ENOSPC)}")
            except OSError as e:
                self._undo(offset, written, e)
                raise JournalError(f"journal {self.path}: append failed at LSN {self.end}: {e}") from e
            self._offset = offset = offset + size
            end = self._start + offset
        if self.fsync and sync:
            self.sync(end)
        return end

    def _undo(self, offset: int, written: int, error: OSError) -> None:
        """Leave no partial record where the next one goes: zero the `written` bytes (on disk already, so
        this needs no room) of a segment with a zero tail, else cut the file; if that fails too, refuse
        further appends."""
        try:
            if self._prealloc:  # (a mapped segment is one: sized to its whole length)
                if written:
                    os.pwrite(self._fd, bytes(written), offset)
            else:
                os.ftruncate(self._fd, offset)
        except OSError as again:
            self._broken = (f"journal {self.path} is unusable after a failed append at offset {offset} "
                            f"({error}; cleanup failed: {again}): reopen the store")

    def _rotate(self) -> None:
        """Close the full active segment and start the next (lock held). With `fsync` it is written back first;
        without, the kernel writes it back (a power loss was promised nothing) and a `sync()` covers it."""
        end = self.end
        self._close_tail()
        if self.fsync:
            os.fdatasync(self._fd)
            with self._sync_cond:
                self._synced = max(self._synced, end)
        os.close(self._fd)
        self._create(end)

    def sync(self, upto: Optional[int] = None) -> int:
        """Make every record below `upto` (default: all appended) power-loss safe; returns the
        LSN known synced. Concurrent callers share one fdatasync."""
        with self._lock:
            if self._broken:
                raise JournalError(self._broken)
            target = self.end if upto is None else upto
        with self._sync_cond:
            while self._synced < target and self._syncing:
                self._sync_cond.wait()
            if self._synced >= target:
                return self._synced
            self._syncing = True
        done = False
        try:
            with self._lock:
                if self._broken:
                    raise JournalError(self._broken)
                fd, end = os.dup(self._fd), self.end  # dup: a rotation may close the original meanwhile
            try:
                if not self.fsync:  # segments closed since the last sync went unsynced: write back them all
                    os.sync()
                os.fdatasync(fd)
                done = True
            finally:
                os.close(fd)
        finally:
            with self._sync_cond:
                self._syncing = False
                if done:
                    self._synced = max(self._synced, end)
                self._sync_cond.notify_all()
        return end

    def checkpoint(self, upto: int, sync: Optional[bool] = None) -> None:
        """Record that everything below LSN `upto` is applied elsewhere, then delete the segments
        wholly below it. Call it only after the applied data is durable where it went. `sync`
        (default: the log's `fsync`): make the marker itself power-loss safe; an applier whose
        replay is idempotent can skip that, since an older marker only replays applied records. Its file
        system calls are made outside the lock appends take: a flow's append never waits them out."""
        sync = self.fsync if sync is None else sync
        with self._checkpoint_lock:
            with self._lock:
                if upto > self.end:
                    raise JournalError(f"checkpoint({upto}) is past the journal's end ({self.end}): "
                                       f"pass an `end` returned by append() or read()")
                if upto <= self.applied:
                    return
            self._marker.write(upto, sync)  # in place: one call (store/checkpoint_marker.py)
            with self._lock:
                self.applied, done = upto, []
                while len(self._segments) > 1 and self._segments[1].start <= upto:
                    done.append(self._segments.pop(0).path)
            for path in done:
                path.unlink()

    # -- reading -----------------------------------------------------------------------------

    def records(self, after: Optional[int] = None, damage: Optional[list[Damage]] = None) -> Iterator[Record]:
        """Records at or past LSN `after` (default: the checkpoint marker), oldest first; a bad
        record ends its segment's records and is appended to `damage`, never yielded."""
        for found, _ in self._segment_reads(self.applied if after is None else after, damage):
            yield from found

    def read(self, after: Optional[int] = None) -> LogRead:
        """Every record past `after` (default: the marker), the damage met, and the LSN to checkpoint."""
        records: list[Record] = []
        damage: list[Damage] = []
        upto = self.applied if after is None else after
        for found, released in self._segment_reads(upto, damage):
            records.extend(found)
            upto = max([upto, released] + [r.end for r in found[-1:]])
        return LogRead(records, damage, upto)

    def _segment_reads(self, after: int,
                       damage: Optional[list[Damage]]) -> Iterator[tuple[list[Record], int]]:
        """Per segment past `after`: its records, and the LSN that releases what was read of it
        (the next segment's start once it is closed)."""
        with self._lock:
            segments = list(self._segments)
            live_end = None if self.readonly else self._offset
        for i, seg in enumerate(segments):
            nxt = segments[i + 1].start if i + 1 < len(segments) else None
            if nxt is not None and nxt <= after:
                continue
            try:
                found, end, bad = read_segment(seg.path, seg.start, nxt, live_end if nxt is None else None,
                                               self.max_record)
            except FileNotFoundError:  # a concurrent checkpoint deleted it: it was applied
                continue
            if bad is not None and damage is not None:
                damage.append(bad)
            yield [r for r in found if r.lsn >= after], end if nxt is None else nxt

    # -- closing -----------------------------------------------------------------------------

    def close(self) -> None:
        """Close the files (records stay where they are; nothing is synced that was not asked)."""
        with self._lock:
            self._close_tail()
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
                self._broken = f"journal {self.path} is closed"
            self._marker.close()
            if self._lock_fd >= 0:
                os.close(self._lock_fd)
                self._lock_fd = -1

    def __enter__(self) -> "SegmentLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
