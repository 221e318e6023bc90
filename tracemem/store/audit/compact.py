"""Giving a DuckDB store's free space back: the file rewritten into a fresh one holding only its live rows.

Why: DuckDB reuses the blocks that deleted rows free, but never shrinks the file, and its `VACUUM`
does not either: a store pruned from 5,000 runs to 50 stays as big, and grows again from there. So
`compact` copies the database (`COPY FROM DATABASE`: tables, views, sequences at their current
values, indexes) into a new file with the store's block size beside it, and moves that over the old
one (`os.replace`, atomic on one file system) while it still holds DuckDB's write lock, so no writer
starts in between; a running agent makes it fail with `StoreLockedError` before anything is done, and
a crash before the move leaves the store as it was (the half-written copy is removed the next time). The run journal
and the memory index beside the file stay valid: the copy keeps the file's salt and every row.
"""
from __future__ import annotations

import os
from typing import Optional

from ...errors import TracememError
from ..opening import connect

__all__ = ["compact"]

SUFFIX = ".compacting"


def compact(path: str) -> tuple[int, int]:
    """Rewrite store file `path` with only its live rows; (bytes before, bytes after)."""
    if path == ":memory:" or not os.path.exists(path):
        raise TracememError(f"no store file at {path} to compact")
    before = _size(path)
    fresh = path + SUFFIX
    for leftover in (fresh, fresh + ".wal"):
        if os.path.exists(leftover):
            os.remove(leftover)
    con = connect(path, read_only=False, block_size=16384, snapshot_if_locked=False).con  # the write lock
    try:
        catalog = con.execute("SELECT current_database()").fetchone()[0]
        block: Optional[int] = con.execute("SELECT block_size FROM pragma_database_size()").fetchone()[0]
        quoted = fresh.replace("'", "''")
        con.execute(f"ATTACH '{quoted}' AS tracemem_compacted (BLOCK_SIZE {int(block or 262144)})")
        con.execute('COPY FROM DATABASE "{}" TO tracemem_compacted'.format(catalog.replace('"', '""')))
        con.execute("DETACH tracemem_compacted")
        con.execute("FORCE CHECKPOINT")  # nothing of the old file is left in its WAL
        os.replace(fresh, path)  # still holding the write lock: no writer can start in between
    except BaseException:
        con.close()
        for leftover in (fresh, fresh + ".wal"):
            if os.path.exists(leftover):
                os.remove(leftover)
        raise
    con.close()
    return before, _size(path)


def _size(path: str) -> int:
    return os.path.getsize(path) + (os.path.getsize(path + ".wal") if os.path.exists(path + ".wal") else 0)
