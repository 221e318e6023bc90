"""`Store`: one DuckDB file — or one PostgreSQL database for a fleet — holding every run, step,
read, write, decision, model call, prompt section and memory; the facade over opening, writing,
loading and retention.

    store = Store("agent.duckdb")                          # or Store("postgresql://host/db")
    run = flow.run({...}, store=store)
    store.sql("SELECT stage, count(*) FROM steps GROUP BY 1").df()

What differs between the two databases sits behind the backend seam (store/backend.py).

Concurrency: any number of threads of one process may run flows into one Store. DuckDB
lets one process write a file at a time; a second process opening it gets
`StoreLockedError` naming the holder, or — with `read_only=True, snapshot_if_locked=True`
(what the CLI does) — reads a snapshot copy of it; a second writing Store on the same file
in the same process is refused (store/registry.py). PostgreSQL takes any number of writing
processes on any number of machines: each opening holds a lease, and runs of an opening
whose lease expired are recovered and marked interrupted by the others (store/pg/lease.py).
"""
from __future__ import annotations

import atexit
import sys
import threading
import weakref
from datetime import datetime
from typing import Any, Callable, Iterable, Optional

from pydantic import BaseModel

from ..errors import StoreError, TracememError
from ..exchange import KnownContent
from ..ids import new_id
from ..masking import HashKey
from ..record import ResumePoint, ThreadRun
from ..run import Run
from ..scope.known import known_scopes
from ..scope.schema import ScopeSchema
from .audit.affected import AffectedReport, affected
from .backend import Backend, is_postgres_url, open_backend
from .audit.blame import BlameReport, blame, verified, wrong_runs
from .claims import claim, release
from .audit.feedback import Feedback
from .audit.feedback import record as record_feedback
from .read.listing import list_runs
from .local_paths import check_local
from .read.load import chain_of, load_run, load_runs, resolve_run_id, thread
from .read.requests import Request, requests_of
from .registry import caller, open_stores
from .audit.retention import PruneReport, prune, pruned_at
from .read.snapshots import SnapshotIndex
from .audit.suspect import suspect_reasons
from .tables import INDEX_FROM, index
from .read.threads import Known, broken_thread, handout, replayed
from .write.listener import Recent, StoreListener
from .write.rows import Batch
from .write.writer import BATCH_COST, MAX_COST, MAX_LAG, Writer


class Store:
    """A tracemem store: `Store(":memory:")` for tests, `Store("agent.duckdb")` for real use,
    `Store("postgresql://user@host/db")` for many processes (`?schema=name` picks a schema).

    On a DuckDB file every run (durability "run") or every stage (durability "stage") is appended to the
    run journal beside it before the call returns (process-crash safe; store/write/journal.py); `fsync=True`
    also fdatasyncs each append, and the claim `flow.resume` takes on a run (power-loss safe). `log` receives
    what opening reports (recovered runs, damaged journal records)."""

    def __init__(self, path: str = ":memory:", *, read_only: bool = False, durability: str = "run",
                 flush_interval: float = 0.05, embedder: Any = "default", snapshot_embedder: Any = "default",
                 snapshot_if_locked: bool = False, block_size: int = 16384,
                 log: Callable[[str], None] = lambda message: None, max_queue: int = MAX_COST,
                 max_batch: int = BATCH_COST, max_lag: float = MAX_LAG, lease_seconds: float = 10.0,
                 fsync: bool = False) -> None:
        self.path = str(path)
        self.read_only = read_only
        self.durability = durability
        self.fsync = fsync  # the journal's appends and resume's claims are fdatasync'd too (power-loss safe)
        self.flush_interval = flush_interval  # 0: each run is on disk before flow.run returns
        self.snapshot_of: Optional[str] = None
        self.snapshot_note = ""
        self.lock = threading.RLock()
        self.block_size = block_size  # for new files: 16 KiB keeps a small agent's file small
        self.lease = new_id()  # this opening of the file: recorded on the runs it writes
        self.closed = False
        self._claim: Optional[str] = None
        if not read_only and self.path != ":memory:" and not is_postgres_url(self.path):  # one writing Store
            self._claim = open_stores.claim(self.path, caller())  # per file per process (PostgreSQL: any number)
        try:
            # PostgreSQL: a dead writer's runs are marked interrupted within about `lease_seconds`
            self._open(read_only, snapshot_if_locked, log, lease_seconds, fsync)
        except BaseException:
            if self._claim is not None:
                open_stores.release(self._claim)
            raise
        self.memory = self._open_memory(embedder)
        if snapshot_embedder == "default":
            from ..memory import HashingEmbedder

            snapshot_embedder = HashingEmbedder()
        self.snapshot_embedder = snapshot_embedder  # embeds each run's query (None: no run snapshots)
        self.snapshots = SnapshotIndex(self.backend.connection(), self.lock, self.backend.follow_snapshots())
        self.recent = Recent()  # the runs recorded last, whose final states resume=<run id> continues
        self.known_content = KnownContent()  # content ids (messages, chains, tool sets) handed to this store
        self.log = log
        self._written_runs = 0  # runs written since the store last checked whether it is big enough to index
        self.writer = Writer(self.backend.writes, self.path, self.lease, flush_interval=flush_interval, max_queue=max_queue,
                             max_batch=max_batch, max_lag=max_lag, embedder=snapshot_embedder, on_written=self._written)
        if not read_only:
            self.writer.start()
        atexit.register(_close_at_exit, weakref.ref(self))
        if self._claim is not None:
            open_stores.attach(self._claim, self)

    def _open(self, read_only: bool, snapshot_if_locked: bool, log: Callable[[str], None],
              lease_seconds: float, fsync: bool) -> None:
        """Open the database (store/backend.py: the schema checked, created or migrated, and runs a dead
        writer left running recovered) and read its secret salt."""
        self.backend: Backend = open_backend(self.path, read_only=read_only, lock=self.lock, lease=self.lease,
                                             block_size=self.block_size, snapshot_if_locked=snapshot_if_locked,
                                             log=log, lease_seconds=lease_seconds, fsync=fsync)
        self.path = self.backend.path
        self.snapshot_of, self.snapshot_note = self.backend.snapshot_of, self.backend.snapshot_note
        self.interrupted = self.backend.interrupted  # runs found running under a dead writer's lease
        try:
            self.salt = HashKey(bytes.fromhex(self.backend.salt or "00"))  # the secret hash key: tracemem/masking.py
            with self.lock:  # (a PostgreSQL schema is indexed from the start: store/pg/schema.py)
                self.indexed = self.backend.shared or (False if self.read_only else index(self.backend.con, log))
        except ValueError:
            self.backend.close()
            raise StoreError(f"{self.path} has an unreadable secret_salt in tracemem_meta (hex expected); "
                             f"restore it from a backup, or delete the row to start a new salt (hashes of "
                             f"secrets recorded so far then no longer match new ones)") from None
        except BaseException:
            self.backend.close()
            raise

    @property
    def con(self) -> Any:
        """A connection to the store's database for your own SQL, one per thread: tracemem never uses it, so
        nothing you do on it can make the writer (or another thread's call) fail. On a DuckDB file it is a
        DuckDB connection (`.cursor()` gives another); on PostgreSQL a connection of its own. Read any table
        at any time; keep your own tables beside tracemem's; writing tracemem's tables may conflict with the
        writer, which then waits and writes again. Leave it open: the store closes it."""
        return self.backend.user_connection()

    def __repr__(self) -> str:
        return f"<Store {self.path}{' (snapshot)' if self.snapshot_of else ''}>"

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _written(self, batch: Batch) -> None:
        """A batch is in (on the writer's thread): the snapshot index learns its embeddings, and the store is
        indexed once it has grown big."""
        if batch.rows["run_embeddings"]:
            self.snapshots.added(batch.rows["run_embeddings"])
        self._written_runs += len(batch.rows["runs"])
        if not self.indexed and self._written_runs >= INDEX_FROM // 10:
            self._written_runs = 0
            with self.lock:
                self.indexed = index(self.backend.con, self.log)

    def _open_memory(self, embedder: Any) -> Any:
        from ..memory import Memory

        kwargs: dict[str, Any] = {} if embedder == "default" else {"embedder": embedder}
        if self.backend.shared:  # no index files: other processes change the table all the time
            kwargs["index_dir"] = None
        elif self.snapshot_of:  # a snapshot copy maps the original's index files (their fingerprints are checked)
            kwargs["index_dir"] = self.snapshot_of + ".memindex"
        return Memory(self.backend.connection(), self.lock, read_only=self.read_only, sql_ops=self.backend.memory_sql,
                      **kwargs)

    # -- writing ------------------------------------------------------------------
    def listener(self, durability: Optional[str] = None) -> StoreListener:
        """What records a run into this store: a listener of its events (`flow.run(..., store=store)` adds it)."""
        self._writable("record runs")
        return StoreListener(self.writer, self.backend.writes.journal, self.lease, durability or self.durability,
                             self.recent)

    def flush(self) -> None:
        """Write every queued run now (queries call this first, so they see every finished run,
        and every finished stage of runs recorded with durability "stage")."""
        self.writer.flush()

    def claim_run(self, run_id: str, steps: int) -> tuple[bool, str, Optional[int], Optional[str]]:
        """Mark a paused or interrupted run (holding `steps` steps, as loaded) as being resumed by this
        process, in one atomic UPDATE (`flow.resume` does this): (won, status, pid, host), the last three
        saying who has it when lost; see store/claims.py."""
        self.flush()
        with self.lock:
            return claim(self.backend.con, run_id, steps, self.lease if self.backend.shared else None,
                         sync=self.fsync or self.backend.shared)

    def release_run(self, run_id: str, status: str) -> None:
        """Give back a claim whose resume could not start (the run is `status` again)."""
        with self.lock:
            release(self.backend.con, run_id, status)

    def close(self) -> None:
        """Write every queued run, stop the writer and close the file."""
        if self.closed:
            return
        self.closed = True
        try:
            self.writer.close()
            self.writer.flush()
        finally:
            with self.lock:
                try:
                    self.memory.close()  # writes the memory index files beside the DuckDB file
                finally:
                    self.backend.close()
            if self._claim is not None:
                open_stores.release(self._claim, self)

    # -- reading ------------------------------------------------------------------
    def _cursor(self) -> Any:
        return self.backend.cursor()

    def sql(self, query: str, params: Any = None, *, timeout: Optional[float] = None) -> Any:
        """The rows of a query: a DuckDB relation, or on PostgreSQL a result with the same methods
        (`.fetchall()`, `.columns`, `.df()`, `.arrow()`); None for a statement that returns nothing.
        On a read-only store the SQL is fenced and stopped after `timeout` seconds (60 by default): DuckDB
        runs it in a locked-down instance (store/read/user_sql.py), PostgreSQL as the store's reader role in a
        READ ONLY transaction (store/pg/reader.py)."""
        self.flush()
        return self.backend.sql(query, params, timeout)

    def register_scope(self, pipeline: str, scope: type[BaseModel]) -> None:
        """Tell tracemem which scope model a pipeline uses, so its loaded runs rebuild it."""
        known_scopes.add_name(pipeline, ScopeSchema(scope))

    def run(self, run_id: str, *, scope: Optional[type[BaseModel]] = None) -> Run:
        """A recorded run (by its id, or a unique prefix of it), loaded as the same `Run` the runner returns."""
        self.flush()
        with self.lock:
            return load_run(self, self.backend.con, run_id, ScopeSchema(scope) if scope else None)

    def resolve_run_id(self, ref: str) -> str:
        """The full id of the run whose id is `ref` or starts with it; RunNotFoundError says whether it was
        pruned, or that the prefix is ambiguous."""
        self.flush()
        with self.lock:
            return resolve_run_id(self.con, ref, self.path)

    def runs_by_id(self, run_ids: list[str]) -> dict[str, Run]:
        """Several recorded runs at once (one query however many), by id; ids not in the store are left
        out."""
        self.flush()
        with self.lock:
            return load_runs(self, self.backend.con, list(run_ids))

    def resume_point(self, run_id: str) -> ResumePoint:
        """What `flow.run(..., resume=run_id)` continues: the run's final state, taken from the states
        this store keeps for the runs it recorded or resumed last (a conversation's next turn costs no
        replay), else replayed once from the file."""
        recent = self.recent.get(run_id)
        if recent is not None:
            known = Known(*recent)
        else:
            self.flush()
            with self.lock:
                known = replayed(self.backend.con, run_id, self.path)
        return ResumePoint(run_id, known.pipeline, known.thread_id, known.schema, handout(known))

    def broken_thread(self, run_id: str, oldest: str) -> str:
        """Why a thread's state cannot be rebuilt: its oldest run here continues one that is gone."""
        with self.lock:
            return broken_thread(self.backend.con, run_id, oldest)

    def pruned_at(self, run_id: str) -> Optional[datetime]:
        """When `prune(force=True)` removed run `run_id` (None: it was never pruned here)."""
        with self.lock:
            return pruned_at(self.backend.con, run_id)

    def requests(self, run: Any) -> dict[str, Request]:
        """The exact request (system instructions, messages, tools, options) and reply of each model call of a
        run (a Run or its id) and its subflows, by call id (store/read/requests.py)."""
        loaded = run if isinstance(run, Run) else self.run(run)
        calls = [c for r in _with_children(loaded) for c in r.rows.get("model_calls", ())]
        self.flush()
        with self.lock:
            thread_runs = [rid for rid, _, _ in chain_of(self.backend.con, loaded.run_id)]
            return requests_of(self.backend.con, calls, thread_runs + [r.run_id for r in _with_children(loaded)])

    def thread(self, run_id: str, root: Optional[str] = None) -> list[ThreadRun]:
        """The conversation thread ending at a run, oldest first, with each run's committed writes
        (to top-level field `root` only, when given)."""
        self.flush()
        with self.lock:
            return thread(self.backend.con, run_id, root)

    def runs(self, *, pipeline: Optional[str] = None, status: Optional[str] = None,
             since: Optional[datetime] = None, until: Optional[datetime] = None, subject: Optional[str] = None,
             limit: int = 100, include_children: bool = False, kind: Optional[str] = None) -> list[dict[str, Any]]:
        """Run summaries with their step counts, newest first, filtered (naive datetimes are UTC, as run
        times are stored); `kind` is "run", "fork", "replay" or "counterfactual". `status="paused"` lists the
        runs waiting for a person, so counterfactuals (which never wait) only with `kind="counterfactual"`."""
        self.flush()
        return list_runs(self._cursor(), pipeline=pipeline, status=status, since=since, until=until,
                         subject=subject, limit=limit, include_children=include_children, kind=kind)

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

    # -- accountability -------------------------------------------------------------
    def feedback(self, run_id: str, verdict: str, *, path: str = "answer", score: Optional[float] = None,
                 note: Optional[str] = None, by: Optional[str] = None) -> Feedback:
        """Record a judgement of run `run_id`'s value at `path`: "wrong", "right", or "score" with
        `score` from 0 to 1. Every judgement is kept; `feedback` is the table."""
        self._writable("record feedback")
        self.flush()
        with self.lock:
            return record_feedback(self.backend.con, run_id, verdict, path=path, score=score, note=note, by=by)

    def affected(self, source: Any) -> AffectedReport:
        """Every run and value that depended on `source` (a memory id, a run id, or `kind:id` for a
        prompt-section source, model, stage, tool or pipeline version), transitively, from the record."""
        self.flush()
        with self.lock:
            return affected(self._cursor(), source)

    def blame(self, *, path: str = "answer", where: Optional[dict[str, Any]] = None, since: Optional[datetime] = None,
              until: Optional[datetime] = None, limit: int = 20, verify: int = 0, **model: Any) -> BlameReport:
        """Sources ranked by going with wrong answers (Ochiai); `verify=k`, `model=`: tested too (store/audit/blame.py)."""
        self.flush()
        with self.lock:
            report = blame(self.backend.cursor(), path=path, where=where, since=since, until=until, limit=limit,
                           tool_sources="tool_calls" in self.tables())
            runs = wrong_runs(self.backend.cursor(), path, 20) if verify else []
        return verified(self, report, runs, path, verify, **model) if verify else report

    def suspect(self, run_ids: Iterable[str]) -> dict[str, str]:
        """Why each of `run_ids` is suspect (marked wrong, or resting on a since-flagged memory or a
        suspect past run); runs that are not are left out. See the `suspect_runs` view."""
        self.flush()
        with self.lock:
            return suspect_reasons(self._cursor(), run_ids)

    def tables(self) -> set[str]:
        """The names of the tables (and views) in the store."""
        return self.backend.tables()

    def _writable(self, what: str) -> None:
        if self.read_only:
            raise TracememError(f"{self.path} is open read-only; open Store('{self.path}') to {what}")

    # -- retention ------------------------------------------------------------------
    def prune(self, *, older_than: Optional[datetime] = None, keep_last: Optional[int] = None,
              dry_run: bool = False, force: bool = False,
              progress: Optional[Callable[[int, int], None]] = None) -> PruneReport:
        """Delete runs (and all their rows) older than a date and/or beyond the newest `keep_last`;
        never a memory, nor a run that kept evidence cites (see store/audit/citations.py): a memory's source,
        a snapshot a kept run loaded, an earlier turn of a thread whose later turns are kept. `force=True`
        removes those too, leaving a tombstone (`pruned_runs`) that traces crossing into them report."""
        self.flush()
        with self.lock:
            report = prune(self.backend.con, older_than=older_than, keep_last=keep_last, dry_run=dry_run, force=force,
                           progress=progress, rebuild_indexes=not self.backend.shared)
        if report.runs and not dry_run:
            self.recent.clear()
            self.known_content.forget()  # content it removed is written again when a call names it
        return report

    def export(self, directory: str, *, progress: Optional[Callable[[int, int], None]] = None) -> dict[str, int]:
        """Write every table to `directory/<table>.parquet` (a folder on this machine); returns rows per table."""
        check_local(directory, "the export folder")
        self.flush()
        with self.lock:
            return self.backend.export(directory, progress=progress)


def _with_children(run: Run) -> list[Run]:
    """A run and its subflows' runs, depth first."""
    return [run] + [r for child in run.children for r in _with_children(child)]


def _close_at_exit(ref: "weakref.ref[Store]") -> None:
    store = ref()
    if store is not None:
        try:
            store.close()
        except TracememError as err:  # at exit there is no caller left to raise to
            print(f"tracemem: {err}", file=sys.stderr)
