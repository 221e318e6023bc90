"""Retention and export: prune old runs without breaking what memories cite."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Optional

from ..dbmeta import first_row
from ..errors import UsageError
from ..times import utc_naive
from .tables import ALL_TABLES, RUN_TABLES, VIEWS


@dataclass
class PruneReport:
    """What `prune` removed (or would remove, with dry_run) and what it kept on purpose."""

    runs: list[str] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=dict)
    kept_cited: list[str] = field(default_factory=list)
    dry_run: bool = False

    def __str__(self) -> str:
        verb = "would remove" if self.dry_run else "removed"
        detail = ", ".join(f"{n} {t}" for t, n in self.rows.items() if n)
        kept = f"; kept {len(self.kept_cited)} run(s) that memories cite" if self.kept_cited else ""
        return f"{verb} {len(self.runs)} run(s)" + (f" ({detail})" if detail else "") + kept


def prune(con: Any, *, older_than: Optional[datetime], keep_last: Optional[int], dry_run: bool,
          progress: Optional[Callable[[int, int], None]] = None) -> PruneReport:
    if older_than is None and keep_last is None:
        raise UsageError("prune needs older_than=<datetime> and/or keep_last=<count>")
    older_than = utc_naive(older_than)
    top = con.execute("SELECT run_id, started_at FROM runs WHERE parent_run_id IS NULL "
                      "ORDER BY started_at DESC").fetchall()
    candidates = []
    for position, (run_id, started) in enumerate(top):
        old = older_than is not None and started is not None and started < older_than
        beyond = keep_last is not None and position >= keep_last
        if (older_than is None or old) and (keep_last is None or beyond):
            candidates.append(run_id)
    report = PruneReport(dry_run=dry_run)
    if not candidates:
        return report
    # DROP then CREATE (not CREATE OR REPLACE): the same SQL runs on DuckDB and PostgreSQL
    con.execute("DROP TABLE IF EXISTS _prune_roots")
    con.execute("CREATE TEMP TABLE _prune_roots (run_id VARCHAR)")
    con.executemany("INSERT INTO _prune_roots VALUES (?)", [[r] for r in candidates])
    # each candidate with every descendant run (subflows), tagged by its root
    con.execute("DROP TABLE IF EXISTS _prune_tree")
    con.execute("""CREATE TEMP TABLE _prune_tree AS
        WITH RECURSIVE tree(root, run_id) AS (
            SELECT run_id, run_id FROM _prune_roots
            UNION ALL SELECT tree.root, r.run_id FROM runs r JOIN tree ON r.parent_run_id = tree.run_id)
        SELECT * FROM tree""")
    cited = {r[0] for r in con.execute(
        "SELECT DISTINCT t.root FROM _prune_tree t JOIN memories m ON m.source_run_id = t.run_id").fetchall()}
    report.kept_cited = sorted(cited)
    con.execute("DELETE FROM _prune_tree WHERE root IN (SELECT unnest(?::VARCHAR[]))", [sorted(cited)])
    report.runs = [r[0] for r in con.execute("SELECT run_id FROM _prune_tree ORDER BY run_id").fetchall()]
    if not report.runs:
        return report
    if not dry_run:
        con.execute("BEGIN TRANSACTION")
    try:
        for i, table in enumerate(RUN_TABLES):
            if table == "prompt_sections":
                where = "prompt_id IN (SELECT prompt_id FROM prompts WHERE run_id IN (SELECT run_id FROM _prune_tree))"
            else:
                where = "run_id IN (SELECT run_id FROM _prune_tree)"
            report.rows[table] = first_row(con.execute(f"SELECT count(*) FROM {table} WHERE {where}"))[0]
            if progress:
                progress(i + 1, len(RUN_TABLES))
        if not dry_run:
            # prompt_sections before prompts: its filter reads prompts
            for table in ("prompt_sections",) + tuple(t for t in RUN_TABLES if t != "prompt_sections"):
                if table == "prompt_sections":
                    con.execute("DELETE FROM prompt_sections WHERE prompt_id IN (SELECT prompt_id FROM prompts "
                                "WHERE run_id IN (SELECT run_id FROM _prune_tree))")
                else:
                    con.execute(f"DELETE FROM {table} WHERE run_id IN (SELECT run_id FROM _prune_tree)")
            con.execute("COMMIT")
    except BaseException:
        if not dry_run:
            con.execute("ROLLBACK")
        raise
    return report


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
