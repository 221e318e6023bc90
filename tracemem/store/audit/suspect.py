"""Suspect runs: answers that rest on something since found wrong, derived, never stored.

A run is suspect when it was marked wrong, when it injected a memory that has since
been flagged (stale, contradicted) or forgotten or purged, when it injected a
memory learned in a suspect run, or when it loaded a suspect run as a snapshot.
`suspect_runs` is a SQL view over the tables that hold those facts, so flagging a
memory makes its runs suspect at once and unflagging it clears them: there is no
copy that can drift. `load_snapshot` never projects a suspect run.
"""
from __future__ import annotations

from typing import Any, Iterable

# Recursion depth through snapshot loads and learned memories; deeper chains are cut (and rare).
MAX_DEPTH = 6

SUSPECT_VIEW_DDL = f"""CREATE OR REPLACE VIEW suspect_runs AS
WITH RECURSIVE
direct(run_id, reason, source_kind, source_id) AS (
    SELECT u.run_id,
           'used memory ' || u.memory_id || ', since ' ||
               CASE WHEN m.memory_id IS NULL THEN 'purged' WHEN m.deleted_at IS NOT NULL THEN 'forgotten'
                    ELSE 'flagged ' || m.review_state END,
           'memory', u.memory_id
    FROM memory_uses u LEFT JOIN memories m ON m.memory_id = u.memory_id
    WHERE u.outcome = 'injected'
      AND (m.memory_id IS NULL OR m.deleted_at IS NOT NULL OR m.review_state IN ('stale', 'contradicted'))
    UNION ALL
    SELECT run_id, 'marked wrong' || CASE WHEN path <> 'answer' THEN ' (' || path || ')' ELSE '' END,
           'feedback', feedback_id
    FROM feedback WHERE verdict = 'wrong' OR (verdict = 'score' AND score < 0.5)),
edges(src, dst, reason, source_kind, source_id) AS (
    SELECT source_run_id, run_id, 'loaded suspect run ' || source_run_id || ' as a snapshot', 'run', source_run_id
    FROM snapshot_uses
    UNION ALL
    SELECT m.source_run_id, u.run_id, 'used memory ' || m.memory_id || ', learned in suspect run ' || m.source_run_id,
           'memory', m.memory_id
    FROM memories m JOIN memory_uses u ON u.memory_id = m.memory_id AND u.outcome = 'injected'
    WHERE m.source_run_id IS NOT NULL AND u.run_id <> m.source_run_id),
chain(run_id, reason, source_kind, source_id, depth) AS (
    SELECT run_id, reason, source_kind, source_id, 0 FROM direct
    UNION
    SELECT e.dst, e.reason, e.source_kind, e.source_id, c.depth + 1
    FROM edges e JOIN chain c ON e.src = c.run_id WHERE c.depth < {MAX_DEPTH})
SELECT run_id, min(depth) AS depth, string_agg(DISTINCT reason, '; ' ORDER BY reason) AS reason,
       arg_min(source_kind, depth) AS source_kind, arg_min(source_id, depth) AS source_id
FROM chain GROUP BY run_id"""


def suspect_reasons(con: Any, run_ids: Iterable[str]) -> dict[str, str]:
    """Why each of `run_ids` is suspect (runs that are not are left out)."""
    ids = sorted(set(run_ids))
    if not ids:
        return {}
    rows = con.execute("SELECT run_id, reason FROM suspect_runs WHERE run_id IN (SELECT unnest(?::VARCHAR[]))",
                       [ids]).fetchall()
    return dict(rows)
