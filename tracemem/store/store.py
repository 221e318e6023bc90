"""`Store`: one DuckDB file holding every run, step, read, write, decision, model call,
prompt section and memory.

    store = Store("agent.duckdb")
    run = flow.run({...}, store=store)
    store.sql("SELECT stage, avg(epoch_ms(ended_at) - epoch_ms(started_at)) FROM steps GROUP BY 1").df()

Concurrency: any number of threads of one process may run flows into one Store.
DuckDB lets one process write a file at a time; a second process opening it gets
`StoreLockedError` naming the holder, or — with `read_only=True,
snapshot_if_locked=True` (what the CLI does) — reads a snapshot copy of it.
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

from ..errors import TracememError
from ..run import Run
from ..schema import pipeline_schema, schema_for
from .load import final_state, load_run, thread_writes
from .rows import first as _first
from .retention import PruneReport, export, prune
from .rows import utc_naive
from .schema import _meta, _set_meta, open_schema
from .snapshots import SnapshotIndex, embedding_rows
from .opening import connect, recover_dead_runs
from .writer import Batch, StoreSink


class Store:
    """A tracemem store: `Store(":memory:")` for tests, `Store("agent.duckdb")` for real use."""

    def __init__(self, path: str = ":memory:", *, read_only: bool = False, durability: str = "run",
                 flush_interval: float = 0.05, embedder: Any = "default", snapshot_embedder: Any = "default",
                 snapshot_if_locked: bool = False,
                 block_size: int = 16384, log: Callable[[str], None] = lambda message: None) -> None:
        self.path = str(path)
        self.read_only = read_only
        self.durability = durability
        self.flush_interval = flush_interval  # 0: each run is on disk before flow.run returns
        self.snapshot_of: Optional[str] = None
        self._snapshot_dir: Optional[str] = None
        self.lock = threading.RLock()
        self.block_size = block_size  # for new files: 16 KiB keeps a small agent's file small
        self.con = self._connect(snapshot_if_locked)
        self._local = threading.local()
        self._schemas: dict[str, Any] = {}
        self._flows: dict[str, Any] = {}  # pipelines run in this process, for backtracking into subflows
        self._pending: list[Run] = []
        self._inflight: dict[str, Run] = {}  # durability "stage" runs still running
        self._cv = threading.Condition()
        self._drain_lock = threading.Lock()
        self._writer: Optional[threading.Thread] = None
        self._errors: list[BaseException] = []
        self._closed = False
        with self.lock:
            open_schema(self.con, self.path, self.read_only or self.snapshot_of is not None, log)
            salt = _meta(self.con, "secret_salt")
            if salt is None and not self.read_only:
                salt = os.urandom(16).hex()
                _set_meta(self.con, "secret_salt", salt)
            self.salt = bytes.fromhex(salt or "00")
            self.interrupted = [] if self.read_only else self._mark_interrupted()
        self.memory = self._open_memory(embedder)
        if snapshot_embedder == "default":
            from ..memory import HashingEmbedder

            snapshot_embedder = HashingEmbedder()
        self.snapshot_embedder = snapshot_embedder  # embeds each run's query (None: no run snapshots)
        self.snapshots = SnapshotIndex(self.con.cursor(), self.lock)
        ref = weakref.ref(self)
        atexit.register(_close_at_exit, ref)

    def __repr__(self) -> str:
        return f"<Store {self.path}{' (snapshot)' if self.snapshot_of else ''}>"

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- opening ----------------------------------------------------------------
    def _connect(self, snapshot_if_locked: bool) -> duckdb.DuckDBPyConnection:
        opened = connect(self.path, self.read_only, self.block_size, snapshot_if_locked)
        if opened.snapshot_of:
            self.snapshot_of, self.path, self.snapshot_note = opened.snapshot_of, opened.path, opened.note
            self._snapshot_dir = os.path.dirname(opened.path)
        return opened.con

    def _mark_interrupted(self) -> list[str]:
        """Runs left 'running' by a process that is gone: their journal is replayed, and those that
        never ended are marked interrupted."""
        return recover_dead_runs(self.con)

    def _open_memory(self, embedder: Any) -> Any:
        from ..memory import Memory

        kwargs = {} if embedder == "default" else {"embedder": embedder}
        cursor = self.con.cursor()
        return Memory(cursor, self.lock, read_only=self.read_only, **kwargs)

    # -- writing ------------------------------------------------------------------
    def sink(self, durability: Optional[str] = None) -> StoreSink:
        """What the runner records a run through (`flow.run(..., store=store)`)."""
        if self.read_only:
            raise TracememError(f"{self.path} is open read-only; open Store('{self.path}') to record runs")
        return StoreSink(self, durability or self.durability)

    def _write_now(self, batch: Batch) -> None:
        with self.lock:
            batch.insert(self.con)
            if batch.rows["run_embeddings"]:
                self.snapshots.added(batch.rows["run_embeddings"])

    def _journal(self, run_id: str, step: int, kind: str, payload: str) -> None:
        """One durable journal row (see store/journal.py)."""
        with self.lock:
            self.con.execute("INSERT INTO step_journal VALUES (?, ?, ?, ?)", [run_id, step, kind, payload])

    def _enqueue(self, run: Run) -> None:
        with self._cv:
            self._pending.append(run)
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_loop, name="tracemem-writer", daemon=True)
                self._writer.start()
            if len(self._pending) >= 256:
                self._cv.notify()

    def _write_loop(self) -> None:
        while True:
            with self._cv:
                if not self._pending and not self._closed:
                    self._cv.wait(self.flush_interval if self.flush_interval > 0 else 0.05)
                if self._closed and not self._pending:
                    return
            self._drain()

    def _drain(self) -> None:
        with self._drain_lock:
            with self._cv:
                runs, self._pending = self._pending, []
            if not runs:
                return
            batch = Batch()
            try:
                for run in runs:
                    batch.add_run(run)
                batch.add_embeddings(embedding_rows(self.snapshot_embedder, runs))
                self._write_now(batch)
            except BaseException:
                self._write_each(runs)

    def _write_each(self, runs: list[Run]) -> None:
        """After a failed batch: write run by run, so one bad run never blocks the others. A run whose
        extra rows (e.g. a `model_calls` row with a wrong type) or query embedding cannot be written is
        written without them; a run that still fails is kept queued. Errors are raised by the next flush()."""
        for i, run in enumerate(runs):
            try:
                self._write_now(_run_batch(self.snapshot_embedder, run, extra=True))
                continue
            except BaseException as err:
                first = err
            try:
                self._write_now(_run_batch(self.snapshot_embedder, run, extra=False))
                extra = ", ".join(sorted(run.rows) + (["query embedding"] if run.query else []))
                self._errors.append(TracememError(
                    f"run {run.run_id} of '{run.pipeline}' was written without its {extra}, which could not be "
                    f"written: {first}"))
            except BaseException as err:  # kept and raised by the next flush()
                with self._cv:
                    self._pending[:0] = runs[i:]
                self._errors.append(TracememError(f"writing runs to {self.path} failed: {err}; they are kept queued"))
                return

    def _materialize(self) -> None:
        """Move the finished stages of running "stage" runs from the journal into their tables,
        so a query sees every finished stage (runs end up whole either way)."""
        with self._drain_lock:
            for run in list(self._inflight.values()):
                mark = run._mark
                if mark is None or mark == run._written:
                    continue
                batch = Batch()
                batch.add_part(run, run._written, mark)
                start = run._written[0] if run._written else 0
                batch.journaled_steps.append((run.run_id, [s.step for s in run.steps[start:mark[0]]]))
                self._write_now(batch)
                run._written = mark

    def flush(self) -> None:
        """Write every queued run now (queries call this first, so they see every finished run,
        and every finished stage of runs recorded with durability "stage")."""
        if self._inflight:
            self._materialize()
        self._drain()
        if self._errors:
            errors, self._errors = self._errors, []
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            raise TracememError(f"{errors[0]}{more}") from errors[0]

    def close(self) -> None:
        """Write every queued run, stop the writer and close the file."""
        if self._closed:
            return
        try:
            self.flush()
        finally:
            with self._cv:
                self._closed = True
                self._cv.notify_all()
            if self._writer is not None:
                self._writer.join(timeout=5)
            with self.lock:
                try:
                    self.memory.close()  # writes the memory index files beside the DuckDB file
                finally:
                    self.con.close()
            if self._snapshot_dir is not None:
                shutil.rmtree(self._snapshot_dir, ignore_errors=True)

    # -- reading ------------------------------------------------------------------
    def _cursor(self) -> duckdb.DuckDBPyConnection:
        cur = getattr(self._local, "cursor", None)
        if cur is None:
            cur = self._local.cursor = self.con.cursor()
        return cur

    def sql(self, query: str, params: Any = None) -> duckdb.DuckDBPyRelation:
        """A DuckDB relation over the store (`.fetchall()`, `.df()`, `.arrow()`)."""
        self.flush()
        try:
            return self._cursor().sql(query, params=params)
        except duckdb.Error as err:
            raise TracememError(f"SQL error: {str(err).splitlines()[0]}") from None

    def register_scope(self, pipeline: str, scope: type[BaseModel]) -> None:
        """Tell the store which scope model a pipeline uses, so loaded runs rebuild it."""
        self._schemas[pipeline] = schema_for(scope)

    def run(self, run_id: str, *, scope: Optional[type[BaseModel]] = None) -> Run:
        """A recorded run, loaded as the same `Run` the runner returns."""
        self.flush()
        with self.lock:
            return load_run(self, self.con, run_id, schema_for(scope) if scope else None)

    def _thread(self, run_id: str, root: str) -> list[tuple[str, dict[str, Any], bool, list[Any]]]:
        """The thread ending at a run, with each run's writes to one field (for backtracking)."""
        self.flush()
        with self.lock:
            return thread_writes(self.con, run_id, root)

    def _final_state(self, run_id: str) -> dict[str, Any]:
        """The final scope data of a recorded run (its whole thread replayed in bulk)."""
        self.flush()
        row = _first(self.con.execute("SELECT pipeline, pipeline_hash FROM runs WHERE run_id = ?", [run_id]))
        schema = (pipeline_schema(row[1]) or self._schemas.get(row[0])) if row else None
        with self.lock:
            return final_state(self.con, run_id, schema.default if schema else (lambda name: None))

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


def _run_batch(embedder: Any, run: Run, extra: bool) -> Batch:
    batch = Batch()
    batch.add_run(run, extra=extra)
    if extra:
        batch.add_embeddings(embedding_rows(embedder, [run]))
    return batch
