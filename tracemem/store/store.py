"""`Store`: one DuckDB file holding every run, step, read, write, decision, model call,
prompt section and memory — the facade over opening, writing, loading and retention.

    store = Store("agent.duckdb")
    run = flow.run({...}, store=store)
    store.sql("SELECT stage, count(*) FROM steps GROUP BY 1").df()

Concurrency: any number of threads of one process may run flows into one Store.
DuckDB lets one process write a file at a time; a second process opening it gets
`StoreLockedError` naming the holder, or — with `read_only=True,
snapshot_if_locked=True` (what the CLI does) — reads a snapshot copy of it. A second
writing Store on the same file in the same process is refused too (store/registry.py):
share the first one.
"""
from __future__ import annotations

import atexit
import os
import shutil
import sys
import threading
import weakref
from datetime import datetime
from typing import Any, Callable, Optional

import duckdb
from pydantic import BaseModel

from ..dbmeta import get_meta, set_meta
from ..errors import StoreError, TracememError
from ..ids import new_id
from ..masking import hash_key
from ..record import ThreadRun
from ..run import Run
from ..scope.known import known_scopes
from ..scope.schema import ScopeSchema
from ..times import utc_naive
from .load import load_run, thread
from .backlog import BATCH_COST, MAX_COST, MAX_LAG
from .diagnose import open_error
from .opening import connect, recover_dead_runs
from .registry import caller, open_stores
from .retention import PruneReport, export, prune
from .snapshots import SnapshotIndex
from .tables import open_schema
from .signals import install_sigterm_flush
from .user_sql import UserSQL
from .writer import StoreSink, Writer


class Store:
    """A tracemem store: `Store(":memory:")` for tests, `Store("agent.duckdb")` for real use."""

    def __init__(self, path: str = ":memory:", *, read_only: bool = False, durability: str = "run",
                 flush_interval: float = 0.05, embedder: Any = "default", snapshot_embedder: Any = "default",
                 snapshot_if_locked: bool = False, block_size: int = 16384,
                 log: Callable[[str], None] = lambda message: None, max_queue: int = MAX_COST,
                 max_batch: int = BATCH_COST, max_lag: float = MAX_LAG) -> None:
        self.path = str(path)
        self.read_only = read_only
        self.durability = durability
        self.flush_interval = flush_interval  # 0: each run is on disk before flow.run returns
        self.snapshot_of: Optional[str] = None
        self.snapshot_note = ""
        self.lock = threading.RLock()
        self.block_size = block_size  # for new files: 16 KiB keeps a small agent's file small
        self.lease = new_id()  # this opening of the file: recorded on the runs it writes
        self.closed = False
        self._claim: Optional[str] = None
        if not read_only and self.path != ":memory:":  # one writing Store per file per process
            self._claim = open_stores.claim(self.path, caller())
        try:
            self._open(read_only, snapshot_if_locked, log)
        except BaseException:
            if self._claim is not None:
                open_stores.release(self._claim)
            raise
        self.memory = self._open_memory(embedder)
        if snapshot_embedder == "default":
            from ..memory import HashingEmbedder

            snapshot_embedder = HashingEmbedder()
        self.snapshot_embedder = snapshot_embedder  # embeds each run's query (None: no run snapshots)
        self.snapshots = SnapshotIndex(self.con.cursor(), self.lock)
        self.writer = Writer(self.con, self.lock, self.path, flush_interval, snapshot_embedder,
                             self.snapshots.added, self.lease, max_queue, max_batch, max_lag)
        # user SQL on a read-only store runs fenced (store/user_sql.py): no files, ATTACH, SET or changes
        self.user_sql = UserSQL(self.path, self.snapshot_of or self.path) if read_only else None
        atexit.register(_close_at_exit, weakref.ref(self))
        if self._claim is not None:
            open_stores.attach(self._claim, self)
            if not open_stores.sigterm_installed:  # SIGTERM flushes queued runs, as exit does
                open_stores.sigterm_installed = install_sigterm_flush(open_stores.flush_all)

    def _open(self, read_only: bool, snapshot_if_locked: bool, log: Callable[[str], None]) -> None:
        """Connect, check (or create, or migrate) the schema and recover runs a dead process left running."""
        opened = connect(self.path, read_only, self.block_size, snapshot_if_locked)
        self.con = opened.con
        self._snapshot_dir: Optional[str] = None
        if opened.snapshot_of:
            self.snapshot_of, self.path, self.snapshot_note = opened.snapshot_of, opened.path, opened.note
            self._snapshot_dir = os.path.dirname(opened.path)
            # removed by close(); if setup fails or close() is never called, when this Store goes (or at exit)
            weakref.finalize(self, shutil.rmtree, self._snapshot_dir, ignore_errors=True)
        self._local = threading.local()
        try:
            with self.lock:
                open_schema(self.con, self.path, self.read_only or self.snapshot_of is not None, log)
                salt = get_meta(self.con, "secret_salt")
                if salt is None and not self.read_only:
                    salt = os.urandom(16).hex()
                    set_meta(self.con, "secret_salt", salt)
                try:
                    self.salt = hash_key(bytes.fromhex(salt or "00"))  # see tracemem/masking.py
                except ValueError:
                    raise StoreError(f"{self.path} has an unreadable secret_salt in tracemem_meta (hex expected); "
                                     f"restore it from a backup, or delete the row to start a new salt (hashes of "
                                     f"secrets recorded so far then no longer match new ones)") from None
                # runs left 'running' by an opening that is gone (a crashed process, whatever its PID): their
                # journal is replayed, and those that never ended are marked interrupted
                self.interrupted = [] if self.read_only else recover_dead_runs(self.con, frozenset({self.lease}),
                                                                               log)
        except duckdb.Error as err:  # a corrupt file, a failing disk: say so, never a raw DuckDB error
            self.con.close()
            raise open_error(err, opened.snapshot_of or self.path) from None
        except BaseException:
            self.con.close()
            raise

    def __repr__(self) -> str:
        return f"<Store {self.path}{' (snapshot)' if self.snapshot_of else ''}>"

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _open_memory(self, embedder: Any) -> Any:
        from ..memory import Memory

        kwargs = {} if embedder == "default" else {"embedder": embedder}
        return Memory(self.con.cursor(), self.lock, read_only=self.read_only, **kwargs)

    # -- writing ------------------------------------------------------------------
    def sink(self, durability: Optional[str] = None) -> StoreSink:
        """What the runner records a run through (`flow.run(..., store=store)`)."""
        if self.read_only:
            raise TracememError(f"{self.path} is open read-only; open Store('{self.path}') to record runs")
        return self.writer.sink(durability or self.durability)

    def flush(self) -> None:
        """Write every queued run now (queries call this first, so they see every finished run,
        and every finished stage of runs recorded with durability "stage")."""
        self.writer.flush()

    def close(self) -> None:
        """Write every queued run, stop the writer and close the file."""
        if self.closed:
            return
        self.closed = True
        try:
            self.writer.flush()
        finally:
            self.writer.stop()
            with self.lock:
                self.con.close()
            if self._claim is not None:
                open_stores.release(self._claim, self)
            if self.user_sql is not None:
                self.user_sql.close()
            if self._snapshot_dir is not None:
                shutil.rmtree(self._snapshot_dir, ignore_errors=True)

    # -- reading ------------------------------------------------------------------
    def _cursor(self) -> duckdb.DuckDBPyConnection:
        cur = getattr(self._local, "cursor", None)
        if cur is None:
            cur = self._local.cursor = self.con.cursor()
        return cur

    def sql(self, query: str, params: Any = None) -> duckdb.DuckDBPyRelation:
        """A DuckDB relation over the store (`.fetchall()`, `.df()`, `.arrow()`). On a read-only store the
        SQL is fenced (store/user_sql.py): no file access, ATTACH, SET or extensions, no changes."""
        self.flush()
        if self.user_sql is not None:
            return self.user_sql.sql(query, params)
        try:
            return self._cursor().sql(query, params=params)
        except duckdb.Error as err:
            raise TracememError(f"SQL error: {str(err).splitlines()[0]}") from None

    def register_scope(self, pipeline: str, scope: type[BaseModel]) -> None:
        """Tell tracemem which scope model a pipeline uses, so its loaded runs rebuild it."""
        known_scopes.add_name(pipeline, ScopeSchema(scope))

    def run(self, run_id: str, *, scope: Optional[type[BaseModel]] = None) -> Run:
        """A recorded run, loaded as the same `Run` the runner returns."""
        self.flush()
        with self.lock:
            return load_run(self, self.con, run_id, ScopeSchema(scope) if scope else None)

    def thread(self, run_id: str, root: Optional[str] = None) -> list[ThreadRun]:
        """The conversation thread ending at a run, oldest first, with each run's committed writes
        (to top-level field `root` only, when given)."""
        self.flush()
        with self.lock:
            return thread(self.con, run_id, root)

    def runs(self, *, pipeline: Optional[str] = None, status: Optional[str] = None,
             since: Optional[datetime] = None, until: Optional[datetime] = None, subject: Optional[str] = None,
             limit: int = 100, include_children: bool = False) -> list[dict[str, Any]]:
        """Run summaries, newest first, filtered (naive datetimes are UTC, as run times are stored)."""
        where, params = [], []
        for column, value in (("pipeline", pipeline), ("status", status), ("subject", subject)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if since is not None:
            where.append("started_at >= ?")
            params.append(utc_naive(since))
        if until is not None:
            where.append("started_at < ?")
            params.append(utc_naive(until))
        if not include_children:
            where.append("parent_run_id IS NULL")
        clause = ("WHERE " + " AND ".join(where)) if where else ""
        rel = self.sql(
            "SELECT run_id, pipeline, status, error, started_at, ended_at, "
            "round(epoch_ns(ended_at - started_at) / 1e6, 3) AS duration_ms, subject, parent_run_id, "
            "(SELECT count(*) FROM steps s WHERE s.run_id = r.run_id) AS steps "
            f"FROM runs r {clause} ORDER BY started_at DESC LIMIT {int(limit)}", params)
        cols = rel.columns
        return [dict(zip(cols, row)) for row in rel.fetchall()]

    def similar_runs(self, pipeline: str, query: str, *, embedder: Any = None, top_k: int = 1,
                     min_score: float = 0.7, exclude: tuple[str, ...] = ()) -> list[tuple[str, str, float]]:
        """Past runs of `pipeline` whose query is most similar to `query` (cosine ≥ min_score, exact)."""
        embedder = embedder or self.snapshot_embedder
        if embedder is None or not query.strip():
            return []
        self.flush()
        vector = embedder.embed([query])[0]
        hits = self.snapshots.similar(pipeline, embedder.embedder_id, vector, top_k=top_k, exclude=exclude)
        return [h for h in hits if h[2] >= min_score - 1e-6]  # float32 rounding, not leniency

    def backtrack(self, run_id: str, path: str, **kwargs: Any) -> Any:
        """`store.run(run_id).backtrack(path)`."""
        return self.run(run_id).backtrack(path, **kwargs)

    # -- retention ------------------------------------------------------------------
    def prune(self, *, older_than: Optional[datetime] = None, keep_last: Optional[int] = None,
              dry_run: bool = False, progress: Optional[Callable[[int, int], None]] = None) -> PruneReport:
        """Delete runs (and all their rows) older than a date and/or beyond the newest
        `keep_last`; never a memory, nor a run a memory cites as its source."""
        self.flush()
        with self.lock:
            return prune(self.con, older_than=older_than, keep_last=keep_last, dry_run=dry_run, progress=progress)

    def export(self, directory: str, *, progress: Optional[Callable[[int, int], None]] = None) -> dict[str, int]:
        """Write every table to `directory/<table>.parquet`; returns rows per table."""
        self.flush()
        with self.lock:
            return export(self.con, directory, progress=progress)


def _close_at_exit(ref: "weakref.ref[Store]") -> None:
    store = ref()
    if store is not None:
        try:
            store.close()
        except TracememError as err:  # at exit there is no caller left to raise to
            print(f"tracemem: {err}", file=sys.stderr)
