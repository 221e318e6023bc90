"""Shard files beside the DuckDB file: the index loads by memory-mapping, not by re-tokenizing.

Layout: `agent.duckdb` keeps its memory index in `agent.duckdb.memindex/`: one
file per subject (`<sha1 of the subject>.shard`) and `manifest.json`, which
names each subject's file and the fingerprint (see fingerprint.py) of the rows
the file was built from. A shard file is a small JSON header followed by
64-byte-aligned numpy arrays; loading it maps them, so opening a million
records costs page faults, not parsing.

Files are written to a temporary name and renamed into place, so a reader (or
a process that crashed mid-write) sees the old file or the new one, and a file
that does not match its header's sizes or its manifest entry is reported as
unusable; the caller then rebuilds that subject from DuckDB.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
from pathlib import Path
from typing import Any, Mapping

import duckdb
import numpy as np

from .errors import MemoryStoreError
from .fingerprint import Fingerprint

__all__ = ["FORMAT", "RowReader", "index_dir", "read_manifest", "write_manifest", "save_shard", "load_shard", "ShardFileError"]

FORMAT = 1
_MAGIC = b"TMSHARD1"
_ALIGN = 64


class ShardFileError(MemoryStoreError):
    """A shard file that cannot be used (missing, torn, another format): rebuild it from DuckDB."""


def index_dir(con: duckdb.DuckDBPyConnection) -> Path | None:
    """`<database file>.memindex` for a file-backed connection; None for an in-memory database."""
    try:
        rows = con.execute("SELECT path FROM duckdb_databases() WHERE database_name = current_database()").fetchall()
    except duckdb.Error:
        return None
    path = rows[0][0] if rows else None
    if not path or path == ":memory:" or not os.path.isfile(path):
        return None
    return Path(f"{path}.memindex")


def read_manifest(folder: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == FORMAT else None


def _replace(path: Path, write: Any) -> None:
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            write(fh)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_manifest(folder: Path, manifest: Mapping[str, Any]) -> None:
    """Write the manifest atomically and remove shard files it no longer names."""
    folder.mkdir(exist_ok=True)
    body = json.dumps({**manifest, "format": FORMAT}, sort_keys=True).encode()
    _replace(folder / "manifest.json", lambda fh: fh.write(body))
    keep = {entry["file"] for entry in manifest.get("shards", {}).values()}
    for old in folder.glob("*.shard"):
        if old.name not in keep:
            old.unlink(missing_ok=True)


def shard_file(subject: str) -> str:
    return hashlib.sha1(subject.encode("utf-8")).hexdigest()[:24] + ".shard"


def save_shard(folder: Path, subject: str, fp: Fingerprint, arrays: Mapping[str, np.ndarray],
               vocab: list[str]) -> str:
    """Write one subject's arrays and vocabulary; returns the file name (for the manifest)."""
    folder.mkdir(exist_ok=True)
    blob = "\n".join(vocab).encode("utf-8")
    items = {**{k: np.ascontiguousarray(v) for k, v in arrays.items()}, "vocab": np.frombuffer(blob, np.uint8)}
    specs, offset = {}, 0
    for name, arr in items.items():
        specs[name] = {"dtype": arr.dtype.str, "shape": list(arr.shape), "offset": offset}
        offset += -(-arr.nbytes // _ALIGN) * _ALIGN
    header = json.dumps({"format": FORMAT, "subject": subject, "fp": list(fp), "n_vocab": len(vocab),
                         "arrays": specs, "size": offset}).encode()
    start = -(-(len(_MAGIC) + 8 + len(header)) // _ALIGN) * _ALIGN

    def write(fh: Any) -> None:
        fh.write(_MAGIC + len(header).to_bytes(8, "little") + header)
        fh.write(b"\0" * (start - fh.tell()))
        for name, arr in items.items():
            fh.write(memoryview(arr).cast("B") if arr.nbytes else b"")
            fh.write(b"\0" * (-arr.nbytes % _ALIGN))

    name = shard_file(subject)
    _replace(folder / name, write)
    return name


class RowReader:
    """A 2-d array in a file, read by rows with `os.pread` instead of being memory-mapped.

    Why: the page cache holds a written file in large folios, and touching one mapped
    row maps its whole folio (here ~1.5 MB per 1.5 KB row), all of it counted in the
    process's resident memory; re-ranking 150 rows per search made a million-record
    shard's float32 vectors resident within a few hundred searches. pread copies only
    the rows asked for. `array()` maps the whole matrix for a full scan.
    """

    def __init__(self, path: Path, offset: int, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.path, self.offset, self.shape, self.dtype = path, offset, shape, np.dtype(dtype)
        self.row_bytes = int(np.prod(shape[1:])) * self.dtype.itemsize
        self._fd = os.open(path, os.O_RDONLY)
        self._mapped: np.ndarray | None = None

    def __len__(self) -> int:
        return self.shape[0]

    def __del__(self) -> None:
        try:
            os.close(self._fd)
        except (OSError, AttributeError):
            pass

    def array(self) -> np.ndarray:
        """The whole matrix, memory-mapped (for full scans and copies)."""
        if self._mapped is None:
            self._mapped = np.memmap(self.path, dtype=self.dtype, mode="r", offset=self.offset, shape=self.shape)
        return self._mapped

    def rows(self, rows: np.ndarray) -> np.ndarray:
        """A copy of the given rows."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) > 4096:
            return np.asarray(self.array()[rows])
        out = np.empty((len(rows), *self.shape[1:]), dtype=self.dtype)
        view = out.reshape(len(rows), -1).view(np.uint8)
        for i, r in enumerate(rows.tolist()):
            view[i] = np.frombuffer(os.pread(self._fd, self.row_bytes, self.offset + r * self.row_bytes), np.uint8)
        return out


def load_shard(path: Path, subject: str, fp: Fingerprint,
               random_access: tuple[str, ...] = ()) -> tuple[dict[str, np.ndarray], list[str]]:
    """Map a shard file's arrays (read-only); ShardFileError when it is not the file the manifest expects.

    Arrays named in `random_access` come as a `RowReader`: they are read a few rows at
    a time with pread, never mapped (see RowReader).
    """
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(_MAGIC) + 8)
            if len(head) < len(_MAGIC) + 8 or head[: len(_MAGIC)] != _MAGIC:
                raise ShardFileError(f"{path} is not a tracemem shard file")
            hlen = int.from_bytes(head[len(_MAGIC):], "little")
            header = json.loads(fh.read(hlen))
        data_start = -(-(len(_MAGIC) + 8 + hlen) // _ALIGN) * _ALIGN
        size = os.path.getsize(path)
    except (OSError, ValueError) as exc:
        raise ShardFileError(f"cannot read {path}: {exc}") from None
    if not isinstance(header, dict) or not isinstance(header.get("arrays"), dict) or "size" not in header:
        raise ShardFileError(f"{path} has no valid header")
    if header.get("format") != FORMAT or header.get("subject") != subject or tuple(header.get("fp", ())) != tuple(fp):
        raise ShardFileError(f"{path} does not hold the expected rows of subject {subject!r}")
    if size != data_start + int(header["size"]):
        raise ShardFileError(f"{path} has {size} bytes, its header says {data_start + int(header['size'])}")
    arrays: dict[str, np.ndarray] = {}
    try:
        with open(path, "rb") as fh:
            whole = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)  # the arrays keep it alive
        for name, spec in header["arrays"].items():
            shape = tuple(spec["shape"])
            dtype = np.dtype(spec["dtype"])
            count = int(np.prod(shape))
            start = data_start + spec["offset"]
            if not count:
                arrays[name] = np.zeros(shape, dtype=dtype)
            elif name in random_access:
                arrays[name] = RowReader(path, start, shape, dtype)  # type: ignore[assignment]
            else:
                arrays[name] = np.frombuffer(whole, dtype=dtype, count=count, offset=start).reshape(shape)
        blob = bytes(arrays.pop("vocab"))
        vocab = blob.decode("utf-8").split("\n") if header["n_vocab"] else []
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ShardFileError(f"cannot map {path}: {exc}") from None
    if len(vocab) != header["n_vocab"]:
        raise ShardFileError(f"{path}: vocabulary of {len(vocab)} terms, header says {header['n_vocab']}")
    return arrays, vocab
