"""Retention and export: prune old runs without breaking the evidence kept runs depend on.

Prune works in set-based statements (100k runs in well under a second): the
candidates are chosen by one window query, their subflow children joined in, and
the evidence they hold found by one join per citing table (store/audit/citations.py).
Only the protection closure — a kept run keeps what it cites, which keeps what
that cites — runs in Python, over the citation edges into the candidates alone.
"""
from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any, Callable, Optional

from ...dbmeta import first_row
from ...errors import UsageError
from ...times import utc_naive, utc_now
from .citations import CITATIONS
from .contents import sweep
from ..tables import ALL_TABLES, RUN_TABLES, VIEWS


IN_FLIGHT = "waiting (paused or interrupted: resume it, or prune with force=True)"


@dataclass
class PruneReport:
    """What `prune` removed (or would remove, with dry_run) and what it kept on purpose."""

    runs: list[str] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=dict)
    kept_cited: list[str] = field(default_factory=list)  # runs kept as evidence (see kept_why)
    kept_why: dict[str, str] = field(default_factory=dict)  # run id → why it was kept
    forced: list[str] = field(default_factory=list)  # evidence removed anyway (force=True), tombstoned
    dry_run: bool = False

    def __str__(self) -> str:
        verb = "would remove" if self.dry_run else "removed"
        detail = ", ".join(f"{n} {t}" for t, n in self.rows.items() if n)
        reasons: dict[str, int] = {}
        for why in self.kept_why.values():
            reasons[why] = reasons.get(why, 0) + 1
        kept = ("; kept " + ", ".join(f"{n} run(s) {why}" for why, n in reasons.items())) if reasons else ""
        forced = f"; {len(self.forced)} of them evidence (force=True), marked pruned" if self.forced else ""
        return f"{verb} {len(self.runs)} run(s)" + (f" ({detail})" if detail else "") + kept + forced


def check_limits(older_than: Any, keep_last: Any) -> Optional[datetime]:
    """The cut-off as naive UTC, after refusing limits that cannot work (one-line UsageError)."""
    if older_than is None and keep_last is None:
        raise UsageError("prune needs older_than=<datetime> and/or keep_last=<count>")
    if keep_last is not None and (isinstance(keep_last, bool) or not isinstance(keep_last, numbers.Integral) or keep_last < 0):
        shown = "infinite" if isinstance(keep_last, float) and math.isinf(keep_last) else repr(keep_last)
        raise UsageError(f"prune keep_last must be a whole number ≥ 0 (the newest runs to keep), got {shown}")
    if older_than is not None and not isinstance(older_than, datetime):
        if isinstance(older_than, date):
            older_than = datetime(older_than.year, older_than.month, older_than.day)
        else:
            raise UsageError(f"prune older_than must be a datetime (runs started before it go), got {older_than!r}")
    return utc_naive(older_than)


def _existing(con: Any) -> dict[str, set[str]]:
    rows = con.execute("SELECT table_name, column_name FROM information_schema.columns "
                       "WHERE table_schema = current_schema()").fetchall()
    out: dict[str, set[str]] = {}
    for table, column in rows:
        out.setdefault(table, set()).add(column)
    return out


def protected(con: Any) -> dict[str, str]:
    """Candidate roots (in `_prune_tree`) that evidence outside the candidates cites, directly or through
    other protected candidates: root → why."""
    have = _existing(con)
    why: dict[str, str] = {}
    edges: dict[str, list[tuple[str, str]]] = {}  # citing root (a candidate) → [(cited root, reason)]
    frontier: list[str] = []
    for c in CITATIONS:
        if not {c.cited} | ({c.citing} if c.citing else set()) <= have.get(c.table, set()):
            continue
        if c.citing is None:
            rows = con.execute(f"SELECT DISTINCT t.root, NULL FROM _prune_tree t "
                               f"JOIN {c.table} x ON x.{c.cited} = t.run_id").fetchall()
        else:
            rows = con.execute(f"SELECT DISTINCT t.root, citer.root FROM _prune_tree t "
                               f"JOIN {c.table} x ON x.{c.cited} = t.run_id "
                               f"LEFT JOIN _prune_tree citer ON citer.run_id = x.{c.citing} "
                               f"WHERE x.{c.citing} IS NOT NULL").fetchall()
        for cited, citer in rows:
            if citer == cited:
                continue  # within one run's own tree
            if citer is None:  # cited by something that stays
                if cited not in why:
                    why[cited] = c.reason
                    frontier.append(cited)
            else:
                edges.setdefault(citer, []).append((cited, c.reason))
    while frontier:  # a kept run keeps what it cites
        for cited, reason in edges.get(frontier.pop(), ()):
            if cited not in why:
                why[cited] = reason
                frontier.append(cited)
    return why


def prune(con: Any, *, older_than: Optional[datetime], keep_last: Optional[int], dry_run: bool,
          force: bool = False, progress: Optional[Callable[[int, int], None]] = None,
          rebuild_indexes: bool = True) -> PruneReport:
    """Remove the runs past the limits (every subflow run with its root) in one transaction, keeping those
    kept runs cite and those waiting to be continued unless `force`; with `dry_run`, count instead."""
    cut = check_limits(older_than, keep_last)
    mark_candidates(con, cut, keep_last)
    report = PruneReport(dry_run=dry_run)
    hold_back(con, report, force)
    report.runs = [r[0] for r in con.execute("SELECT run_id FROM _prune_tree ORDER BY run_id").fetchall()]
    if not report.runs:
        return report
    rebuild = [] if dry_run or not rebuild_indexes else indexes_to_rebuild(con, len(report.runs))
    for name, _ in rebuild:
        con.execute(f'DROP INDEX "{name}"')
    try:
        remove_runs(con, report, progress)
    finally:
        for _, sql in rebuild:
            con.execute(sql)
    return report


def mark_candidates(con: Any, cut: Optional[datetime], keep_last: Optional[int]) -> None:
    """The runs past the limits in `_prune_roots` (top-level runs only) and in `_prune_tree` each of them with
    every descendant run (subflows), tagged by its root."""
    # DROP then CREATE (not CREATE OR REPLACE), an aliased subquery: the same SQL runs on PostgreSQL
    con.execute("DROP TABLE IF EXISTS _prune_roots")
    con.execute("""CREATE TEMP TABLE _prune_roots AS
        SELECT run_id FROM (SELECT run_id, started_at, row_number() OVER (ORDER BY started_at DESC) - 1 AS position
                            FROM runs WHERE parent_run_id IS NULL) ranked
        WHERE ($cut::TIMESTAMP IS NULL OR (started_at IS NOT NULL AND started_at < $cut::TIMESTAMP))
          AND ($keep::BIGINT IS NULL OR position >= $keep::BIGINT)""", {"cut": cut, "keep": None if keep_last is None else int(keep_last)})
    con.execute("DROP TABLE IF EXISTS _prune_tree")
    con.execute("""CREATE TEMP TABLE _prune_tree AS
        WITH RECURSIVE tree(root, run_id) AS (
            SELECT run_id, run_id FROM _prune_roots
            UNION ALL SELECT tree.root, r.run_id FROM runs r JOIN tree ON r.parent_run_id = tree.run_id)
        SELECT * FROM tree""")


def hold_back(con: Any, report: PruneReport, force: bool) -> None:
    """Take out of `_prune_tree` the candidates that must stay, noting why in `report`: evidence a kept run
    cites, and a run waiting for a person (paused) or one a crash left to be continued (interrupted), which
    is work in flight, not history (counterfactual runs never wait for anyone). With `force` they go too, the
    evidence among them listed as forced."""
    evidence = protected(con)
    if force:
        report.forced = sorted(evidence)
        return
    in_flight = [r[0] for r in con.execute(
        "SELECT r.run_id FROM runs r JOIN _prune_roots p ON p.run_id = r.run_id "
        "WHERE r.status IN ('paused', 'interrupted') AND r.counterfactual IS NULL").fetchall()]
    report.kept_why = dict(sorted({**evidence, **{r: IN_FLIGHT for r in in_flight}}.items()))
    report.kept_cited = sorted(evidence)
    con.execute("DELETE FROM _prune_tree WHERE root IN (SELECT unnest(?::VARCHAR[]))", [list(report.kept_why)])


def indexes_to_rebuild(con: Any, removed: int) -> list[tuple[str, str]]:
    """The run tables' indexes (name, SQL) to drop before removing `removed` runs and build again after.

    DuckDB removes each deleted row from every index when the delete commits (~4 µs a row): when most of
    the store goes, dropping the indexes first and building them again over what is left is several times
    faster (they are rebuilt in `prune`'s `finally`, and on the next open if the process dies between).
    PostgreSQL (`rebuild_indexes=False`) keeps its indexes in step itself."""
    if removed * 4 < first_row(con.execute("SELECT count(*) FROM runs"))[0]:
        return []
    return con.execute("SELECT index_name, sql FROM duckdb_indexes() WHERE database_name = current_database() "
                       "AND table_name IN (SELECT unnest(?::VARCHAR[]))", [list(RUN_TABLES)]).fetchall()


def remove_runs(con: Any, report: PruneReport, progress: Optional[Callable[[int, int], None]]) -> None:
    """Delete every row of the runs left in `_prune_tree` (count them, for a dry run), sweep the content no
    remaining call names, and leave a tombstone per removed run, all in one transaction."""
    dry_run = report.dry_run
    in_tree = "run_id IN (SELECT run_id FROM _prune_tree)"
    sections = f"prompt_id IN (SELECT prompt_id FROM prompts WHERE {in_tree})"
    if not dry_run:
        con.execute("BEGIN TRANSACTION")
    try:
        # prompt_sections before prompts: its filter reads prompts; a DELETE answers with its row count
        order = ("prompt_sections",) + tuple(t for t in RUN_TABLES if t != "prompt_sections")
        for i, table in enumerate(order):
            where = sections if table == "prompt_sections" else in_tree
            verb = "SELECT count(*) FROM" if dry_run else "DELETE FROM"
            report.rows[table] = first_row(con.execute(f"{verb} {table} WHERE {where}"))[0]
            if progress:
                progress(i + 1, len(order))
        report.rows = {t: report.rows[t] for t in RUN_TABLES}
        if "message_chains" in _existing(con):  # content no remaining call names (store/audit/contents.py)
            report.rows.update(sweep(con, "run_id NOT IN (SELECT run_id FROM _prune_tree)", [], dry_run))
        if not dry_run:
            # a tombstone per removed run: a trace crossing into one, or a resume of one, says "pruned"
            con.execute("INSERT INTO pruned_runs SELECT run_id, ? FROM _prune_tree", [utc_now()])
            con.execute("COMMIT")
    except BaseException:
        if not dry_run:
            con.execute("ROLLBACK")
        raise


def pruned_at(con: Any, run_id: str) -> Optional[datetime]:
    """When `prune(force=True)` removed run `run_id` (its tombstone in `pruned_runs`; None: never)."""
    row = first_row(con.execute("SELECT max(pruned_at) FROM pruned_runs WHERE run_id = ?", [run_id]))
    return row[0] if row else None


def export(con: Any, directory: str, progress: Optional[Callable[[int, int], None]] = None) -> dict[str, int]:
    """Every table (and the derived views) as `directory/<name>.parquet`; rows per name."""
    os.makedirs(directory, exist_ok=True)
    counts: dict[str, int] = {}
    everything = ALL_TABLES + VIEWS
    for i, table in enumerate(everything):
        target = os.path.join(directory, f"{table}.parquet").replace("'", "''")
        con.execute(f"COPY (SELECT * FROM {table}) TO '{target}' (FORMAT parquet)")
        counts[table] = first_row(con.execute(f"SELECT count(*) FROM {table}"))[0]
        if progress:
            progress(i + 1, len(everything))
    return counts
