"""The journal: what must survive a crash before `flow.run` (or a stage, with durability "stage") returns.

A journal entry is one piece of a run, as text: `run` (a whole run: its runs row and
records), `begin` (a "stage" run's runs row), `step` (one finished stage's records),
`part` (what a resumed run added) or `end` (a run's end facts). The writer later puts the
run into the tables; until then its entries are where it is.

Where entries go depends on the database:
- a DuckDB file: `FileJournal`, a file beside it (`agent.duckdb.journal`) that entries are
  appended to, each framed as length, CRC-32 and bytes. Its space is allocated ahead and
  mapped into memory: an append is a copy into the operating system's cache of the file,
  there once copied, so a process killed right after keeps the entry, as after a
  `write()`. Unlike `write()`, the copy makes no system call and so keeps Python's GIL,
  which a system call lets the store's writer thread take, to be waited for to get back (a
  tenth to a fifth of a "stage" run's time, bench/HISTORY.md). With `fsync=True` each
  entry is written with `pwrite()` and fdatasync'd instead (`_remap` says why).
  Allocated ahead, an append does not change the file's size, and a sync writes the entry,
  not the file's metadata too (a third less time per sync here); a length of 0 ends the
  entries, and a closed journal is cut to its entries. How far the tables hold it is one
  number, `journal_applied` in `tracemem_meta`, moved in the same transaction as each
  batch the writer commits, so a crash at any moment neither loses an entry nor applies
  one twice. Opening the file replays what lies past that number (store/write/recovery.py)
  and empties the journal.
- PostgreSQL: `step_journal` rows committed on a connection of their own (store/pg/backend.py
  `PgJournal`: any worker can recover another's runs); the writer deletes a run's rows in the
  transaction that writes it.
- `:memory:`: none (nothing outlives the process).
"""
from __future__ import annotations

import errno
import json
import mmap
import os
import struct
import threading
import zlib
from json.encoder import encode_basestring_ascii as quoted
from typing import Any, Iterator, Optional, Protocol

import orjson

from ...run import Run
from .rows import Records, end_facts, run_row

__all__ = ["Entry", "Journal", "FileJournal", "run_entry", "begin_entry", "step_entry", "end_entry", "MAX_ENTRY"]

Entry = tuple[str, int, str, str]
"""A journal entry: (run id, step, kind, JSON text) — also the columns of a `step_journal` row."""
FRAME = struct.Struct("<II")  # an entry's length and CRC-32, before its bytes
MAX_ENTRY = 1 << 30  # a length past this is a torn frame, not an entry
EMPTY = bytes(FRAME.size)  # a length of 0 and no checksum: where the entries end
ALLOCATE = (64 << 10, 4 << 20)  # the least and most bytes of the journal's file allocated ahead at a time
END = 2**31 - 1  # the step an `end` entry sorts after


def _records(records: Records) -> dict[str, Any]:
    steps, reads, writes, decisions, rows = records
    return {"steps": steps, "reads": reads, "writes": writes, "decisions": [[d.step, d.chosen, d.evidence] for d in decisions],
            "rows": [[t, r] for t, r in rows if not t.startswith("_")]}


def _text(value: Any) -> str:
    """JSON text as the standard library writes it, by orjson (four times quicker) where the two agree: a lone
    surrogate or a NUL escaped, never raw; a value JSON has no form for written as its str(). (NaN is written
    as null, as the tables store it.)"""
    try:
        return orjson.dumps(value, default=_orjson_fallback, option=_AS_STDLIB).decode()
    except TypeError:  # a lone surrogate, an integer past 64 bits, a key that is not text, a named tuple
        return _ENCODER.encode(value)


def _fallback(value: Any) -> str:
    try:
        return str(value)
    except Exception:  # noqa: BLE001 - a value whose str() raises is still journaled, as its type
        return f"<{type(value).__name__}>"


def _orjson_fallback(value: Any) -> str:
    if isinstance(value, tuple):  # a named tuple: an array, as the standard library writes it
        raise TypeError("a named tuple")
    return _fallback(value)


_ENCODER = json.JSONEncoder(default=_fallback)  # (json.dumps with `default` would build one per call)
_AS_STDLIB = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS  # str() of these, as `json` does


def run_entry(run: Run, lease: Optional[str], records: Records) -> Entry:
    """A whole run (durability "run"): its runs row and every record (`run_records(run)`)."""
    return (run.run_id, 0, "run", _text({"run": list(run_row(run, lease)), **_records(records)}))


def begin_entry(run: Run, lease: Optional[str]) -> Entry:
    """A durability "stage" run began: its runs row (status running)."""
    return (run.run_id, 0, "begin", _text({"run": list(run_row(run, lease))}))


def step_entry(run_id: str, records: Records) -> Entry:
    """Finished stages: one (durability "stage"), or what a resumed run added."""
    steps = records[0]
    return (run_id, steps[0][0] if steps else 0, "step", _text(_records(records)))


def end_entry(run: Run) -> Entry:
    """A run's end facts (status, error, output, ...)."""
    return (run.run_id, END, "end", _text(end_facts(run)))


class Journal(Protocol):
    """Where entries wait for the writer: `append` returns a position the writer hands back once the entry is
    in the tables (None where positions mean nothing); `sync` makes appends so far power-loss safe."""

    def append(self, entry: Entry, sync: bool) -> Optional[int]: ...

    def sync(self) -> None: ...

    def close(self) -> None: ...


class FileJournal:
    """A DuckDB file's journal (see the module docstring): one file, appended by any thread."""

    def __init__(self, path: str, fsync: bool, ident: str) -> None:
        self.path, self.fsync, self.ident = path, fsync, ident
        self.lock = threading.RLock()  # (the listener holds it around an append and the queueing of its piece)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self.allocated = os.fstat(self._fd).st_size
        self._map: Optional[mmap.mmap] = None  # the allocated space, mapped (None: none is, or fsync=True)
        self._remap()
        self.size = entries_end(path)  # (what an opening found is applied and emptied first: normally 0)
        if not self.size:
            self._header()

    def append(self, entry: Entry, sync: bool) -> int:
        """Append one entry (fdatasync'd when `sync`, on an `fsync=True` journal); its end position."""
        with self.lock:
            return self._write(_frame(entry), sync)

    def _write(self, frame: bytes, sync: bool) -> int:
        end = self.size + len(frame)
        try:
            if end > self.allocated:
                self._allocate(end)
            if self._map is not None:
                self._map[self.size:end] = frame  # in the OS's cache of the file once copied (module docstring)
            else:  # (fsync=True: a sync's system call comes with each entry anyway)
                done = 0
                while done < len(frame):  # (a short write: the rest again, which says why it cannot)
                    done += os.pwrite(self._fd, frame[done:], self.size + done)
            if sync and self.fsync:
                os.fdatasync(self._fd)
        except OSError:
            self._cut(self.size)  # no torn entry left to stop a replay of what follows
            raise
        self.size = end
        return end

    def _allocate(self, needed: int) -> None:
        """Allocate the file's space past `needed`, by about what it holds (64 KiB to 4 MiB: zeros, read as the
        end of the entries); on a disk too full for that, just up to `needed`."""
        try:
            self._allocate_to(needed + min(ALLOCATE[1], max(ALLOCATE[0], self.size)))
        except OSError as err:
            if err.errno != errno.ENOSPC:
                raise
            self._allocate_to(needed)

    def _allocate_to(self, end: int) -> None:
        """Reserve the disk's blocks up to `end`, then map them: a copy into the mapping then never meets a full
        disk, which a mapped hole would answer with SIGBUS, not an error."""
        if hasattr(os, "posix_fallocate"):
            os.posix_fallocate(self._fd, self.allocated, end - self.allocated)
        else:  # (no posix_fallocate here: zeros written reserve the blocks too)
            os.pwrite(self._fd, bytes(end - self.allocated), self.allocated)
        self.allocated = end
        self._remap()

    def _remap(self) -> None:
        """Map the allocated space anew (after it grew or was cut); not with `fsync=True`, whose appends are
        written, not copied: syncing mapped pages costs more (each is write-protected, and faults at the next
        append), 10% of a synced stage measured."""
        self._unmap()
        self._map = mmap.mmap(self._fd, self.allocated) if self.allocated and not self.fsync else None

    def _unmap(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None

    def _cut(self, size: int) -> None:
        """Cut the file, and what is allocated and mapped, to `size` bytes (unmapped first: a mapping past the
        file's end is a SIGBUS waiting to happen)."""
        self._unmap()
        os.ftruncate(self._fd, size)
        self.allocated = size
        self._remap()

    def sync(self) -> None:
        if self.fsync:
            os.fdatasync(self._fd)

    def empty(self, applied: int, reset: Any) -> bool:
        """Truncate the journal when the tables hold all of it (`applied` is its size), then `reset()` the
        applied position to 0, both before any other append; whether it did. It never waits for the lock: a
        producer holding it may be waiting for room in the writer's queue, which is who calls this."""
        if not self.lock.acquire(blocking=False):
            return False
        try:
            if applied != self.size:
                return False
            self._cut(0)
            self.size = 0
            reset()
            self._header()
            return True
        finally:
            self.lock.release()

    def _header(self) -> None:
        """The first entry: whose journal this is (recovery.py moves a journal of another file aside)."""
        self._write(_frame(("", 0, "journal", self.ident)), sync=False)

    def close(self) -> None:
        try:
            self._unmap()
            os.ftruncate(self._fd, self.size)  # (its entries, without the space allocated ahead)
        finally:
            os.close(self._fd)


def _frame(entry: Entry) -> bytes:
    """An entry as the journal file holds it: length and CRC-32, then its bytes."""
    data = _framed(entry)
    return FRAME.pack(len(data), zlib.crc32(data)) + data


def _framed(entry: Entry) -> bytes:
    """An entry's bytes: its run id, step and kind as a JSON array, a newline, then its text as it is (JSON text
    holds no raw newline, so the text is never escaped a second time)."""
    run_id, step, kind, text = entry
    return f"[{quoted(run_id)},{int(step)},{quoted(kind)}]\n{text}".encode()


def _unframed(data: bytes) -> Entry:
    """The entry `_framed` wrote."""
    head, newline, text = data.partition(b"\n")
    if not newline:
        raise ValueError("no line with its run id, step and kind")
    run_id, step, kind = json.loads(head)
    return run_id, step, kind, text.decode()


def read_entries(path: str, start: int) -> Iterator[tuple[Optional[Entry], int, Optional[str]]]:
    """The entries of a journal file from byte `start`: (entry, end position, None), or (None, position, why)
    for a damaged one (a torn tail after a crash, or corruption); reading stops at the first, and at a length
    of 0 (space allocated ahead, never written)."""
    with open(path, "rb") as f:
        f.seek(start)
        pos = start
        while True:
            head = f.read(FRAME.size)
            if not head or head == EMPTY:
                return
            if len(head) < FRAME.size:
                yield None, pos, "a torn entry header at the end"
                return
            size, crc = FRAME.unpack(head)
            data = f.read(size) if size <= MAX_ENTRY else b""
            if len(data) < size or size > MAX_ENTRY:
                yield None, pos, "a torn entry at the end"
                return
            if zlib.crc32(data) != crc:
                yield None, pos, "an entry whose checksum does not match (corrupt)"
                return
            pos += FRAME.size + size
            try:
                yield _unframed(data), pos, None
            except (ValueError, TypeError) as err:
                yield None, pos, f"an entry that is not JSON ({err})"


def entries_end(path: str) -> int:
    """Where a journal file's entries end (the position the next one goes to)."""
    end = 0
    for entry, pos, _ in read_entries(path, 0):
        if entry is None:
            break
        end = pos
    return end
