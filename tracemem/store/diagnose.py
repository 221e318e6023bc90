"""What a DuckDB error means for a store file, told by the exception's type and DuckDB's fixed
wording with the file's path taken out (a path may itself contain "lock" or "corrupt").

Two questions are asked of it: when opening, which error to give the user (another
process holds the file, the file is corrupt, it is not a DuckDB file); and when
writing, whether the failure is momentary (a busy connection, a write conflict, an
interrupted system call: try again shortly, losing nothing), the file's (disk full, I/O
error: stop accepting runs, loudly) or the data's (a value DuckDB cannot hold: isolate it
and carry on).
"""
from __future__ import annotations

import errno
import os
import re
from typing import Optional

import duckdb
import pyarrow as pa

from ..errors import StoreError

_DATA_ERRORS = (pa.ArrowException, UnicodeError, OverflowError, TypeError, ValueError, duckdb.DataError,
                duckdb.InvalidInputException, duckdb.IntegrityError)
_DISK_FULL = os.strerror(errno.ENOSPC)
_FILE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS}  # "No space left on device": the OS's text, which DuckDB passes on


def _without(text: str, path: Optional[str]) -> str:
    """The message with every spelling of the file's path removed."""
    if path:
        for spelling in {path, os.path.abspath(path), os.path.realpath(path)}:
            text = text.replace(spelling, "<path>")
    return text


def first_line(err: BaseException) -> str:
    return (str(err).splitlines() or [type(err).__name__])[0]


def storage_failure(err: BaseException) -> Optional[str]:
    """What is wrong with the file when `err` means it cannot be written now (None: the data is at fault)."""
    text = str(err)
    if _DISK_FULL in text or (isinstance(err, OSError) and err.errno == errno.ENOSPC):
        return f"the disk is full (ENOSPC: {first_line(err)})"
    if isinstance(err, (duckdb.IOException, duckdb.FatalException, duckdb.OutOfMemoryException)) or (
            isinstance(err, OSError) and err.errno in _FILE_ERRNOS):  # not any OSError: a network embedder's
        return f"{type(err).__name__}: {first_line(err)}"                # ConnectionError is about the run
    if isinstance(err, duckdb.TransactionException) and "Failed to commit" in text:
        return f"the commit failed: {first_line(err)}"
    if isinstance(err, duckdb.Error) and "database has been invalidated" in text:
        return f"DuckDB invalidated the database after an earlier fatal error: {first_line(err)}"
    return None


_MOMENTARY_ERRNOS = {errno.EAGAIN, errno.EINTR, errno.EBUSY, errno.ETIMEDOUT}
_MOMENTARY_TEXTS = tuple(os.strerror(e) for e in sorted(_MOMENTARY_ERRNOS))


def transient_failure(err: BaseException) -> Optional[str]:
    """Why `err` is momentary, worth the same write again shortly (None: it is not): the connection was busy
    with another call, another transaction changed the same rows, a lock was held, a system call was
    interrupted. A failed commit or a lost file are not (`storage_failure`)."""
    text = str(err)
    if isinstance(err, duckdb.ResourceInUseException):
        return f"the connection was busy: {first_line(err)}"
    if isinstance(err, duckdb.TransactionException) and "Failed to commit" not in text:
        return f"a transaction conflict: {first_line(err)}"
    if isinstance(err, duckdb.InterruptException):
        return f"the statement was interrupted: {first_line(err)}"
    if isinstance(err, OSError) and err.errno in _MOMENTARY_ERRNOS or \
            isinstance(err, duckdb.IOException) and any(t in text for t in _MOMENTARY_TEXTS):
        return f"a momentary I/O error: {first_line(err)}"
    return None


def is_data_error(err: BaseException) -> bool:
    """Whether `err` is about a value (Arrow or DuckDB could not hold it), not about the file."""
    return isinstance(err, _DATA_ERRORS) and storage_failure(err) is None


def lock_conflict(err: BaseException, path: str) -> Optional[str]:
    """The holder ("process 123") when `err` is DuckDB refusing the file's lock; None otherwise."""
    if not isinstance(err, duckdb.IOException):
        return None
    text = _without(str(err), path)
    if not text.startswith("IO Error: Could not set lock on file"):
        return None
    pid = re.search(r"\(PID (\d+)\)", text)
    return f"process {pid.group(1)}" if pid else "another process"


def same_process_conflict(err: BaseException, path: str) -> bool:
    """DuckDB refusing a second connection to a file this process has open with other settings."""
    return isinstance(err, duckdb.ConnectionException) and \
        "different configuration" in _without(str(err), path)


def open_error(err: BaseException, path: str) -> StoreError:
    """The error to give for a file that failed to open (not a lock conflict: see `lock_conflict`)."""
    text = _without(str(err), path)
    if "Corrupt database file" in text or "checksum" in text or isinstance(err, duckdb.SerializationException):
        return StoreError(
            f"cannot open {path}: the file is corrupt ({first_line(err)}). Restore it from a backup; to salvage what is readable, "
            f"copy it and query the copy with plain DuckDB (duckdb.connect(copy, read_only=True))")
    if "not a valid DuckDB database file" in text:
        return StoreError(f"cannot open {path}: it is not a DuckDB file, so not a tracemem store; point tracemem "
                          f"at another path, e.g. --db agent.duckdb")
    failure = storage_failure(err)
    if failure is not None:
        return StoreError(f"cannot open {path}: {failure}")
    return StoreError(f"cannot open {path}: {first_line(err)}")
