"""For tests that damage a journal by hand: write bytes where the next record would go.

A mapped segment (store/mapped_tail.py) is sized to its whole length, zeros after its last
record, so "the end of the file" is not where a process killed mid-append leaves its bytes.
"""
from __future__ import annotations

from pathlib import Path

from tracemem.store.log_format import read_segment


def write_at_tail(segment: Path, data: bytes) -> None:
    """Write `data` right after the last valid record of `segment` (the last segment of its journal)."""
    start = int(segment.stem, 16)
    _, end, _ = read_segment(segment, start, None, None, 1 << 30)
    with open(segment, "r+b") as f:
        f.seek(end - start)
        f.write(data)
