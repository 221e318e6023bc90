"""`Memory`: the long-term memory of a store (`store.memory`).

Every change is one transaction that writes the record and its `memory_events`
row together, then updates the in-process index, all under the store's lock
(the DuckDB connection is shared between threads). Reads of single records go
to DuckDB; searches go to the index, which mirrors the live rows. For a store
file the index persists beside it (`<file>.memindex/`, see cache.py): `close()`
writes it, and the next process maps it instead of re-reading every record.
"""

from __future__ import annotations

import threading
from pathlib import Path
from datetime import datetime
from typing import Any, Callable, Iterable, Mapping, Sequence

import duckdb
import numpy as np

from . import binding, bulk, fingerprint, overlap, persist, shared, sql
from .cache import IndexCache
from .context import CONTEXT_WEIGHT, CONTEXT_WINDOW
from .default import default_embedder
from .embedders import Embedder
from .errors import MemoryInputError, MemoryNotFoundError, MemoryStoreError
from .index import Shard, VectorIndex
from .records import (REVIEW_STATES, UPDATABLE_FIELDS, MemoryEvent, MemoryRecord, check_fields, check_subject,
                      check_window, to_utc_naive)
from .search import Exclusion, SearchResult, rank_shard, scored_records
from ..times import utc_now
from .tables import MEMORY_COLUMNS

__all__ = ["Memory", "DEFAULT_FLOOR"]

DEFAULT_FLOOR = 60
_DEFAULT: Any = object()


def _row(rec: MemoryRecord) -> tuple[Any, ...]:
    return tuple(getattr(rec, c) for c in MEMORY_COLUMNS)


def _record(row: Sequence[Any]) -> MemoryRecord:
    return MemoryRecord(**dict(zip(MEMORY_COLUMNS, row)))


class Memory:
    """Remember, change, forget and honestly recall facts, scoped by subject."""

    def __init__(self, con: duckdb.DuckDBPyConnection, lock: threading.RLock | None = None, *,
                 embedder: Embedder | None = _DEFAULT, floor: float = DEFAULT_FLOOR,
                 clock: Callable[[], datetime] | None = None, read_only: bool = False,
                 index_dir: str | Path | None = "auto", sql_ops: Any = None,
                 context_weight: float = CONTEXT_WEIGHT, context_window: int = CONTEXT_WINDOW) -> None:
        if not (isinstance(floor, (int, float)) and 0 <= floor <= 100):
            raise MemoryInputError(f"floor must be in 0..100, got {floor!r}")
        if isinstance(context_window, bool) or not isinstance(context_window, int) or context_window < 0:
            raise MemoryInputError(f"context_window must be a whole number of records (0: off), got {context_window!r}")
        self.con = con
        self.lock = lock if lock is not None else threading.RLock()
        self.embedder: Embedder | None = embedder
        self.floor = float(floor)
        self.context_weight = float(context_weight)  # neighbours' share in a record's score (memory/context.py)
        self.context_window = context_window  # records either side a strong candidate lifts (0: none)
        self._clock = clock or utc_now
        self.sql: Any = sql_ops or sql  # memory/sql.py, or the store's (PostgreSQL: store/pg/memory_sql.py)
        with self.lock:
            if not read_only:  # DuckDB refuses even CREATE ... IF NOT EXISTS on a read-only file
                self.sql.ensure_tables(con)  # no-ops when the store already created them
            if embedder is _DEFAULT:  # MiniLM where installed, else hashing; a bound store keeps its own (default.py)
                self.embedder = default_embedder(binding.bound_id(con))
            binding.check_store_embedder(con, self.embedder)
            self._seen = self.sql.last_event(con) if self.sql.SHARED else 0  # memory_events applied (shared.py)
            folder = persist.index_dir(con) if index_dir == "auto" else None if index_dir is None else Path(index_dir)
        self._cache = IndexCache(con, folder=folder, writable=not read_only, ops=self.sql)

    def reembed(self, embedder: Embedder) -> int:
        """Switch the store to another embedder: every vector is recomputed, the index rebuilt."""
        with self.lock:
            if embedder is None:
                raise MemoryInputError("reembed() needs an embedder")
            n = binding.reembed_all(self.con, embedder, ops=self.sql)
            self.embedder = embedder
            self.rebuild_index()
            return n

    # -- index ---------------------------------------------------------------------
    def rebuild_index(self) -> int:
        """Rebuild the in-process index (and its files) from DuckDB, embedding any record stored without a vector."""
        with self.lock:
            self._seen = self.sql.last_event(self.con) if self.sql.SHARED else 0
            return self._cache.rebuild(self.embedder)

    def save_index(self) -> list[str]:
        """Write the index files of subjects changed since the last save; returns those subjects.

        The index files sit beside the DuckDB file (`<file>.memindex/`) so the next
        process maps them instead of re-reading every record. In-memory and read-only
        stores have none. `close()` saves too.
        """
        with self.lock:
            return self._cache.save()

    def close(self) -> None:
        """Save the index files (the DuckDB connection belongs to the caller and stays open)."""
        self.save_index()

    def _loaded(self) -> VectorIndex:
        return self._cache.get(self.embedder)

    def shard(self, subject: str) -> Shard | None:
        """The index shard of one subject (its file mapped on first use); None if it has no record."""
        with self.lock:
            return self._loaded().shard(subject)

    @property
    def rebuilt_subjects(self) -> list[str]:
        """Subjects whose index file was missing, broken or stale, and was rebuilt from DuckDB."""
        return list(self._cache.rebuilt)

    def index_is_current(self) -> bool:
        """Whether the index mirrors the memories table, by fingerprint (a full scan: for checks, not hot paths)."""
        with self.lock:
            self._loaded()
            return self._cache.fp == fingerprint.by_subject(self.con)

    # -- writes ----------------------------------------------------------------------
    def remember(self, subject: str, text: str, *, tags: Sequence[str] = (), confidence: float = 60,
                 valid_from: datetime | None = None, valid_until: datetime | None = None,
                 source_run_id: str | None = None, source_step: int | None = None, source_ref: str | None = None,
                 review_state: str = "fresh", run_id: str | None = None,
                 embedding: Sequence[float] | np.ndarray | None = None, embedder_id: str | None = None) -> MemoryRecord:
        """Store one fact about `subject`; returns the record (logged as a `remember` event)."""
        item = dict(text=text, tags=tags, confidence=confidence, valid_from=valid_from, valid_until=valid_until,
                    source_run_id=source_run_id, source_step=source_step, source_ref=source_ref,
                    review_state=review_state)
        vec = None if embedding is None else binding.given_vector(self.embedder, embedding, embedder_id)
        return self._remember([(subject, item)], run_id=run_id, given=vec)[0]

    def remember_many(self, items: Iterable[Mapping[str, Any]], *, run_id: str | None = None) -> list[MemoryRecord]:
        """Bulk `remember`: each item is a dict of remember()'s arguments (subject and text required)."""
        pairs = []
        for item in items:
            item = dict(item)
            if "subject" not in item or "text" not in item:
                raise MemoryInputError(f"each item needs 'subject' and 'text', got keys {sorted(item)}")
            pairs.append((item.pop("subject"), item))
        with bulk.cyclic_gc_paused(len(pairs)):
            return self._remember(pairs, run_id=run_id, given=None)

    def _remember(self, pairs: list[tuple[str, dict[str, Any]]], *, run_id: str | None,
                  given: np.ndarray | None) -> list[MemoryRecord]:
        now = to_utc_naive(self._clock(), "clock()")
        recs = bulk.new_records(pairs, now=now, embedder_id=self.embedder.embedder_id if self.embedder else None)

        def events() -> list[tuple[Any, ...]]:
            event = bulk.EventJSON(sql.event_json)
            return [(r.memory_id, "remember", None, event(r), run_id, now, None) for r in recs]

        overlapped = given is None and overlap.can_overlap(self.sql, self.embedder, len(recs))
        vecs = given if given is not None or overlapped else binding.embed(self.embedder, [r.text for r in recs])
        with self.lock:
            index = self._loaded()
            if overlapped:  # DuckDB inserts and commits while Python embeds and indexes (overlap.py)
                overlap.remember_overlapped(self.con, self.embedder, recs, events, index, self._cache)
                return recs
            with self.sql.transaction(self.con):
                rows = bulk.rows_of(recs)
                added = self.sql.insert_records(self.con, rows, vecs, self.embedder.dim if self.embedder else None)
                self.sql.insert_events(self.con, events())
                if vecs is not None:
                    binding.bind(self.con, self.embedder)
            self._cache.note(added)
            index.add_many(rows, vecs)
        return recs

    def _change(self, memory_id: str, event: str, fields: dict[str, Any], *, run_id: str | None,
                reason: str | None, allow_forgotten: bool = False, extra_events: Sequence[tuple] = (),
                now: datetime | None = None) -> MemoryRecord:
        """Apply `fields` to one record in one transaction with its event; keep the index in step."""
        with self.lock:
            old = self.get(memory_id)
            if old.forgotten and not allow_forgotten:
                raise MemoryInputError(f"memory {memory_id} was forgotten at {old.deleted_at}; "
                                       f"remember the fact again instead of changing it")
            now = now or to_utc_naive(self._clock(), "clock()")
            changed = {k: v for k, v in fields.items() if getattr(old, k) != v}
            if not changed:
                return old
            new = old.model_copy(update={**changed, "updated_at": now})
            MemoryRecord.model_validate(new.model_dump())  # re-check every rule on the result
            check_window(new.valid_from, new.valid_until)
            vec = None
            db_fields: dict[str, Any] = {**changed, "updated_at": now}
            if "text" in changed and self.embedder is not None:
                vec = binding.embed(self.embedder, [new.text])
                db_fields["embedding"] = vec[0]
                db_fields["embedder_id"] = self.embedder.embedder_id
                new = new.model_copy(update={"embedder_id": self.embedder.embedder_id})
            index = self._loaded()
            oldv, newv = old.audit_view(), new.audit_view()
            with self.sql.transaction(self.con):
                before = fingerprint.of_ids(self.con, [memory_id])
                self.sql.update_record(self.con, memory_id, db_fields)
                after = fingerprint.of_ids(self.con, [memory_id])
                self.sql.insert_events(self.con, [(memory_id, event, {k: oldv[k] for k in changed},
                                              {k: newv[k] for k in changed}, run_id, now, reason), *extra_events])
            self._cache.note([(s, fp, -1) for s, fp in before.items()], [(s, fp, +1) for s, fp in after.items()])
            index.retire(new.subject, memory_id)
            if not new.forgotten:  # a changed record moves to the end: index rows follow the order of writes
                stored = self.embedding(memory_id) if vec is None and self.embedder is not None else None
                index.add_many([_row(new)], vec if stored is None else stored[None, :])
            return new

    def update(self, memory_id: str, *, run_id: str | None = None, reason: str | None = None,
               **changes: Any) -> MemoryRecord:
        """Change text, tags, confidence, review_state, validity window or source_ref (logged)."""
        bad = set(changes) - set(UPDATABLE_FIELDS)
        if bad:
            raise MemoryInputError(f"cannot update {sorted(bad)}: updatable fields are {', '.join(UPDATABLE_FIELDS)}")
        if not changes:
            raise MemoryInputError("update() needs at least one field to change")
        return self._change(memory_id, "update", check_fields(changes), run_id=run_id, reason=reason)

    def flag(self, memory_id: str, state: str, reason: str, *, run_id: str | None = None) -> MemoryRecord:
        """Set the review state (stale/contradicted keep it out of recall) with a reason (logged)."""
        if state not in REVIEW_STATES:
            raise MemoryInputError(f"state {state!r} is not one of {', '.join(REVIEW_STATES)}")
        if not isinstance(reason, str) or not reason.strip():
            raise MemoryInputError("flag() needs a non-empty reason: the history must say why")
        return self._change(memory_id, "flag", {"review_state": state}, run_id=run_id, reason=reason)

    def supersede(self, old_id: str, new_id: str, *, run_id: str | None = None,
                  reason: str | None = None) -> MemoryRecord:
        """Mark `old_id` contradicted and link it to `new_id` (both kept; both logged)."""
        if old_id == new_id:
            raise MemoryInputError(f"a memory cannot supersede itself ({old_id})")
        with self.lock:
            new = self.get(new_id)
            old = self.get(old_id)
            if new.subject != old.subject:
                raise MemoryInputError(f"cannot link memories of two subjects ({old.subject!r} and {new.subject!r})")
            if new.forgotten:
                raise MemoryInputError(f"memory {new_id} was forgotten; it cannot supersede {old_id}")
            now = to_utc_naive(self._clock(), "clock()")
            link = (new_id, "supersedes", None, {"supersedes": old_id}, run_id, now, reason)
            return self._change(old_id, "supersede", {"review_state": "contradicted", "superseded_by": new_id},
                                run_id=run_id, reason=reason, extra_events=[link], now=now)

    def forget(self, memory_id: str, *, run_id: str | None = None, reason: str | None = None) -> MemoryRecord:
        """Soft delete: the record leaves every search and list but stays for audit (logged)."""
        with self.lock:
            old = self.get(memory_id)
            if old.forgotten:
                return old  # idempotent: nothing changes, nothing to log
            now = to_utc_naive(self._clock(), "clock()")
            return self._change(memory_id, "forget", {"deleted_at": now}, run_id=run_id, reason=reason, now=now)

    def purge(self, memory_id: str, *, run_id: str | None = None, reason: str | None = None) -> None:
        """Hard delete: the row goes, and the text is scrubbed from earlier events; the purge is logged."""
        with self.lock:
            old = self.get(memory_id)
            now = to_utc_naive(self._clock(), "clock()")
            index = self._loaded()
            with self.sql.transaction(self.con):
                gone = fingerprint.of_ids(self.con, [memory_id])
                self.con.execute("DELETE FROM memories WHERE memory_id = ?", [memory_id])
                self.con.execute("UPDATE memory_events SET old = CASE WHEN old IS NULL THEN NULL ELSE '{\"purged\": true}' END, "
                                 "new = CASE WHEN new IS NULL THEN NULL ELSE '{\"purged\": true}' END "
                                 "WHERE memory_id = ? AND event NOT IN ('supersedes')", [memory_id])
                self.sql.insert_events(self.con, [(memory_id, "purge", None, None, run_id, now, reason)])
            self._cache.note([(s, fp, -1) for s, fp in gone.items()])
            index.retire(old.subject, memory_id)

    # -- reads ---------------------------------------------------------------------------
    def get(self, memory_id: str) -> MemoryRecord:
        """The record, forgotten or not; MemoryNotFoundError if it never existed or was purged."""
        with self.lock:
            rows = self.sql.fetch_records(self.con, "memory_id = ?", [memory_id])
        if not rows:
            raise MemoryNotFoundError(f"no memory {memory_id!r} (never stored, or purged: see history())")
        return _record(rows[0])

    def embedding(self, memory_id: str) -> np.ndarray | None:
        """The stored vector of a record (None when it has none)."""
        with self.lock:
            rows = self.con.execute("SELECT embedding FROM memories WHERE memory_id = ?", [memory_id]).fetchall()
        row = rows[0] if rows else None
        if row is None:
            raise MemoryNotFoundError(f"no memory {memory_id!r}")
        return None if row[0] is None else np.asarray(row[0], dtype=np.float32)

    def history(self, memory_id: str) -> list[MemoryEvent]:
        """Every event of a record, oldest first (also after a purge)."""
        import json

        with self.lock:
            rows = self.con.execute('SELECT event_id, memory_id, event, old, new, run_id, "at", reason '
                                    "FROM memory_events WHERE memory_id = ? ORDER BY event_id", [memory_id]).fetchall()
        if not rows:
            raise MemoryNotFoundError(f"no memory {memory_id!r} and no history for it")
        return [MemoryEvent(event_id=r[0], memory_id=r[1], event=r[2], old=json.loads(r[3]) if r[3] else None,
                            new=json.loads(r[4]) if r[4] else None, run_id=r[5], at=r[6], reason=r[7]) for r in rows]

    def records(self, subject: str, *, include_forgotten: bool = False, review_states: Sequence[str] | None = None,
                tag: str | None = None, limit: int | None = None, offset: int = 0) -> list[MemoryRecord]:
        """The subject's records, oldest first; forgotten ones only on request (`list` is the old name)."""
        where, params = ["subject = ?"], [check_subject(subject)]
        if not include_forgotten:
            where.append("deleted_at IS NULL")
        if review_states is not None:
            bad = set(review_states) - set(REVIEW_STATES)
            if bad:
                raise MemoryInputError(f"unknown review states {sorted(bad)}")
            where.append(f"review_state IN ({', '.join('?' * len(review_states))})" if review_states else "FALSE")
            params.extend(review_states)
        if tag is not None:
            where.append("list_contains(tags, ?)")
            params.append(tag)
        clause = " AND ".join(where) + " ORDER BY created_at, memory_id"
        if limit is not None:
            clause += f" LIMIT {int(limit)}"
        clause += f" OFFSET {int(offset)}"
        with self.lock:
            rows = self.sql.fetch_records(self.con, clause, params)
        return [_record(r) for r in rows]

    def subjects(self) -> list[str]:
        """Subjects that have at least one live record."""
        with self.lock:
            return [r[0] for r in self.con.execute(
                "SELECT DISTINCT subject FROM memories WHERE deleted_at IS NULL ORDER BY subject").fetchall()]

    # -- search ----------------------------------------------------------------------------
    def _fetch(self, ids: Sequence[str]) -> list[tuple[Any, ...]]:
        return self.sql.fetch_records(self.con, "memory_id = ANY(?::VARCHAR[])", [list(ids)]) if ids else []  # IN (?, ...): a hash join, 2x slower

    def search(self, subject: str, query: str, *, semantic: bool = True, recall: bool = False,
               limit: int | None = 10, now: datetime | None = None) -> SearchResult:
        """Ranked search within one subject; `recall=True` applies the prompt-injection contract."""
        check_subject(subject)
        if not isinstance(query, str) or not query.strip():
            raise MemoryInputError("query is empty: pass the text to search for (use list(subject) to browse)")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise MemoryInputError(f"limit must be a positive int or None, got {limit!r}")
        at = to_utc_naive(now, "now") if now is not None else to_utc_naive(self._clock(), "clock()")
        emb = self.embedder
        reason: str | None = None
        with self.lock:
            if self.sql.SHARED:  # apply what other processes changed since the last search (memory/shared.py)
                self._seen = shared.catch_up(self._loaded(), self.sql, self.con, self._seen)
            shard = self._loaded().shard(subject)
            qvec = None
            if semantic:
                if emb is None:
                    reason = "no embedder configured"
                elif shard is not None and shard.live_count() and shard.indexed_count() == 0:
                    reason = f"no record of subject {subject!r} is indexed (stored without embeddings)"
                else:
                    try:
                        qvec = binding.embed(self.embedder, [query])[0]  # type: ignore[index]
                    except Exception as exc:  # an embedder failure must degrade, loudly, not crash recall
                        reason = f"index error: query embedding failed: {type(exc).__name__}: {exc}"
            mode = "semantic" if semantic and reason is None else "literal"
            result = SearchResult(subject=subject, query=query, records=[], mode=mode, requested_semantic=semantic,
                                  index_unavailable_reason=reason, now=at,
                                  caveat=getattr(emb, "caveat", None) if mode == "semantic" else None,
                                  embedder_id=emb.embedder_id if emb is not None and mode == "semantic" else None,
                                  recall_filtered=recall, recall_floor=self.floor if recall else None)
            if shard is None or not shard.live_count():
                return result
            for attempt in range(2):
                ranking = rank_shard(shard, query, query_vec=qvec if mode == "semantic" else None,
                                     lexical_weight=float(getattr(emb, "lexical_weight", 0.5)),
                                     min_similarity=float(getattr(emb, "min_similarity", 0.0)),
                                     recall=recall, floor=self.floor, now=at, limit=limit,
                                     context_weight=self.context_weight, context_window=self.context_window)
                records = scored_records(shard, ranking, subject, self._fetch)
                if records is not None:
                    break
                if attempt:
                    raise MemoryStoreError(f"the memory index of subject {subject!r} disagrees with the memories "
                                           f"table even after a rebuild; is another connection writing to it?")
                self._cache.rebuild(self.embedder, [subject])  # the table changed behind the index: DuckDB wins
                shard = self._loaded().shard(subject)
                if shard is None or not shard.n:
                    return result
            assert records is not None
            scan = ranking.scan or (shard.vecs.mode() if shard.vecs is not None and mode == "semantic" else None)
            scan_recall = shard.vecs.int8_recall if scan == "int8" and shard.vecs is not None else None
            excluded = [Exclusion(memory_id=shard.id_at(r), reason=why, detail=d)  # type: ignore[arg-type]
                        for r, why, d in ranking.exclusions]
        return result.model_copy(update=dict(
            scan=scan, scan_recall=scan_recall, **ranking.count_fields(), records=records, total_before_filter=ranking.total, cut_by_limit=ranking.cut, excluded=excluded,
            excluded_flagged=ranking.counts["flagged"], excluded_below_floor=ranking.counts["below_floor"],
            excluded_out_of_window=ranking.counts["out_of_window"]))

    list = records  # the name before `records`; kept so existing callers work (it shadows the builtin only here)
