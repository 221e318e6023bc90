"""The bytes of the journal (`segment_log`): framing, checksums, and telling a clean end from damage.

Kept apart from the log's lifecycle so the format can be read, checked and tested on
its own, and so a reader never needs the writer's state.

A journal directory holds:

- `<16 hex digits>.seg`: segments, named by their first LSN (a log-wide byte
  position). A segment is a 24-byte header (magic, version, flags, first LSN,
  crc32 of those 20 bytes) followed by records. A record is
  `<u32 length><u32 crc32 of the payload, seeded with the length><payload>`, so a
  corrupted length fails the check too; its LSN is the segment's first LSN plus
  its offset. LSNs only grow: a new segment starts where the previous one's
  records end.
- A preallocated segment (flag 1) was allocated at full size when created and is
  written with `pwrite`: overwriting allocated blocks spares fdatasync the
  file-size update (about 25% faster here). The zeros after its last record are
  its clean end; in a segment that was not preallocated, zeros at the end are
  what a power loss leaves of writes never synced, and are reported.
- `applied`: the checkpoint marker, `<u64 LSN><u32 crc32>`, rewritten in place
  (store/checkpoint_marker.py): a torn one fails its CRC and the log is read from
  its oldest segment; empty, it is no marker.
- `lock`: `flock`ed by the one process that writes the journal (its pid inside).
"""
from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path
from typing import NamedTuple, Optional, Union

from ..errors import TracememError


class JournalError(TracememError):
    """The journal cannot be opened, written or read as asked."""


class JournalLockedError(JournalError):
    """Another process (or another open in this one) holds the journal for writing."""


MAGIC = b"TMJRNL\r\n"  # \r\n catches a copy through a text-mode tool
VERSION = 1
FLAG_PREALLOCATED = 1
_SEG_HEAD = struct.Struct("<8sHHQ")  # magic, version, flags, first LSN
_CRC = struct.Struct("<I")
SEGMENT_HEADER = _SEG_HEAD.size + _CRC.size
RECORD_STRUCT = struct.Struct("<II")  # payload length, crc32(payload, length)
RECORD_HEADER = RECORD_STRUCT.size
_LSN = struct.Struct("<Q")


class Record(NamedTuple):
    """One record read back: `lsn` is where it starts, `end` where the next one starts."""

    lsn: int
    end: int
    data: bytes


class Damage(NamedTuple):
    """A record (or file) that failed its check: never returned; the rest of `segment` is skipped."""

    segment: str
    lsn: int  # where the bad record starts
    offset: int  # the same place, as a byte offset in the file
    reason: str
    skipped: int  # bytes from `offset` to the end of the file


def journal_dir(store_path: Union[str, Path]) -> Path:
    """Where the journal of the store file at `store_path` lives."""
    return Path(f"{os.fspath(store_path)}.journal")


def segment_name(start: int) -> str:
    return f"{start:016x}.seg"


def frame(data: bytes) -> bytes:
    """A record as written: length, checksum, payload."""
    return RECORD_STRUCT.pack(len(data), zlib.crc32(data, len(data))) + data


def segment_header(start: int, flags: int) -> bytes:
    head = _SEG_HEAD.pack(MAGIC, VERSION, flags, start)
    return head + _CRC.pack(zlib.crc32(head))


def check_header(buf: bytes, start: int) -> tuple[Optional[str], int]:
    """Why the segment image `buf`, named as starting at LSN `start`, is unusable (None: it is
    fine), and its flags."""
    if len(buf) < SEGMENT_HEADER:
        return f"truncated segment header ({len(buf)} of {SEGMENT_HEADER} bytes)", 0
    magic, version, flags, first = _SEG_HEAD.unpack_from(buf)
    if magic != MAGIC or zlib.crc32(buf[:_SEG_HEAD.size]) != _CRC.unpack_from(buf, _SEG_HEAD.size)[0]:
        return "not a journal segment (bad magic or header checksum)", 0
    if version != VERSION:
        return f"segment version {version}; this tracemem reads version {VERSION}: upgrade tracemem", 0
    if first != start:
        return f"segment header says it starts at LSN {first}, its name says {start}", 0
    return None, flags


def marker_bytes(lsn: int) -> bytes:
    raw = _LSN.pack(lsn)
    return raw + _CRC.pack(zlib.crc32(raw))


def parse_marker(raw: bytes) -> Optional[int]:
    """The LSN a checkpoint marker holds, or None if it is not a whole, valid marker."""
    if len(raw) != _LSN.size + _CRC.size or zlib.crc32(raw[:_LSN.size]) != _CRC.unpack_from(raw, _LSN.size)[0]:
        return None
    return _LSN.unpack_from(raw)[0]


def scan(buf: bytes, limit: int, max_record: int,
         zero_tail_ok: bool = False) -> tuple[list[tuple[int, bytes]], int, Optional[str]]:
    """Records of a segment image (from its header up to `limit`): [(offset, payload)], the
    offset where valid records end, and why they end there (None: at `limit`, or at the
    zeros of a preallocated segment when `zero_tail_ok`)."""
    out: list[tuple[int, bytes]] = []
    off = SEGMENT_HEADER
    while off < limit:
        short = off + RECORD_HEADER > limit
        length, crc = (0, 0) if short else RECORD_STRUCT.unpack_from(buf, off)
        if length == 0 and crc == 0 and buf.count(0, off, limit) == limit - off:  # only zeros from here on
            if zero_tail_ok and limit == len(buf):
                return out, off, None
            return out, off, f"zero-filled tail ({limit - off} bytes): writes never synced were lost"
        if short:
            return out, off, f"truncated record header ({limit - off} of {RECORD_HEADER} bytes)"
        if length == 0:
            return out, off, "zeros where a record header belongs, with data after them"
        if length > max_record:
            return out, off, f"implausible length {length} (max_record is {max_record})"
        start = off + RECORD_HEADER
        if start + length > limit:
            return out, off, f"truncated record: {length} bytes declared, {limit - start} present"
        data = buf[start:start + length]
        if zlib.crc32(data, length) != crc:
            return out, off, "checksum mismatch"
        out.append((off, data))
        off = start + length
    return out, off, None


def read_segment(path: Path, start: int, next_start: Optional[int], live_end: Optional[int],
                 max_record: int) -> tuple[list[Record], int, Optional[Damage]]:
    """The valid records of one segment file, the LSN where they end, and the damage that ends
    them early. `next_start`: the following segment's first LSN (None: this is the last);
    `live_end`: read the last segment only up to this offset (the writer's own appends)."""
    buf = path.read_bytes()
    bad, flags = check_header(buf, start)
    end, found = 0, []
    if bad is None:
        limit = len(buf) if next_start is not None or live_end is None else min(live_end, len(buf))
        found, end, bad = scan(buf, limit, max_record, zero_tail_ok=bool(flags & FLAG_PREALLOCATED))
        if next_start is not None and start + end > next_start:
            found = [(o, d) for o, d in found if start + o + RECORD_HEADER + len(d) <= next_start]
            end = found[-1][0] + RECORD_HEADER + len(found[-1][1]) if found else SEGMENT_HEADER
            bad = bad or f"records run past the next segment's start (LSN {next_start})"
    records = [Record(start + o, start + o + RECORD_HEADER + len(d), d) for o, d in found]
    damage = None if bad is None else Damage(str(path), start + end, end, bad, len(buf) - end)
    return records, start + max(end, SEGMENT_HEADER), damage


def take_lock(folder: Path) -> int:
    """Lock journal directory `folder` for this process (the lock file names its pid); the lock's fd.
    `JournalLockedError` names the process holding it."""
    import fcntl

    fd = os.open(folder / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise JournalLockedError(f"journal {folder} is open for writing by process {holder}; "
                                 f"close that store first (one writing process per store)") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
