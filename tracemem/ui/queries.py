"""The runs list as SQL over the public tables: filters, one page, the total, and a change token.

`store.runs()` answers "the newest N runs"; the viewer also needs an offset, an id prefix, the
question each run answered, feedback, and a count, so it asks the store's SQL (the `runs`, `steps`
and `feedback` tables are the documented contract). The `feedback` table comes with the
accountability work and may be missing: its filter and column appear only when it exists.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, Mapping, Optional

from ..errors import UsageError

__all__ = ["KNOWN_STATUSES", "RunFilter", "RunsPage", "has_table", "options", "runs_page", "runs_version"]

KNOWN_STATUSES = ("ok", "failed", "running", "paused", "interrupted")
FEEDBACK_CHOICES = ("any", "none", "wrong", "right")


def has_table(store: Any, table: str, *columns: str) -> bool:
    """Whether the store has `table` (with every one of `columns`)."""
    rows = store.sql("SELECT column_name FROM information_schema.columns WHERE table_name = ? "
                     "AND table_schema = 'main'", [table]).fetchall()
    have = {r[0] for r in rows}
    return bool(have) and set(columns) <= have


@dataclass
class RunFilter:
    """What the runs page was asked for (every field from the query string; empty = no filter)."""

    pipeline: str = ""
    status: str = ""
    subject: str = ""
    since: str = ""
    until: str = ""
    feedback: str = ""
    id: str = ""
    children: str = ""
    page: int = 1
    per_page: int = 50

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> "RunFilter":
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = (query.get(f.name) or "").strip()
            if f.type == "int" or f.name in ("page", "per_page"):
                if raw:
                    try:
                        values[f.name] = max(1, min(int(raw), 500 if f.name == "per_page" else 10 ** 9))
                    except ValueError:
                        raise UsageError(f"{f.name} must be a whole number, got {raw!r}") from None
            else:
                values[f.name] = raw
        out = cls(**values)
        if out.feedback and out.feedback not in FEEDBACK_CHOICES:
            raise UsageError(f"feedback must be one of {', '.join(FEEDBACK_CHOICES)}, got {out.feedback!r}")
        for name in ("since", "until"):
            if getattr(out, name):
                _when(name, getattr(out, name))
        return out

    def query(self, **changes: Any) -> dict[str, str]:
        """The query-string parameters of this filter (with `changes`), empty ones left out."""
        values = {f.name: getattr(self, f.name) for f in fields(self)} | changes
        defaults = {f.name: f.default for f in fields(self)}
        return {k: str(v) for k, v in values.items() if v not in ("", None) and v != defaults[k]}

    def where(self, feedback_table: bool) -> tuple[str, list[Any]]:
        """The WHERE clause (over `runs r`) and its parameters."""
        where: list[str] = []
        params: list[Any] = []
        for column in ("pipeline", "status", "subject"):
            value = getattr(self, column)
            if value:
                where.append(f"r.{column} = ?")
                params.append(value)
        if self.id:
            where.append("starts_with(r.run_id, ?)")
            params.append(self.id)
        if self.since:
            where.append("r.started_at >= ?")
            params.append(_when("since", self.since))
        if self.until:
            where.append("r.started_at < ?")
            params.append(_when("until", self.until))
        if not self.children and not self.id:
            where.append("r.parent_run_id IS NULL")
        if self.feedback and feedback_table:
            if self.feedback in ("any", "none"):
                exists = "EXISTS (SELECT 1 FROM feedback f WHERE f.run_id = r.run_id)"
                where.append(exists if self.feedback == "any" else f"NOT {exists}")
            else:
                where.append("EXISTS (SELECT 1 FROM feedback f WHERE f.run_id = r.run_id AND f.verdict = ?)")
                params.append(self.feedback)
        return ("WHERE " + " AND ".join(where)) if where else "", params


# run times are TIMESTAMP_NS: a bound outside what nanoseconds can hold is clamped to the ends
EARLIEST, LATEST = datetime(1678, 1, 1), datetime(2262, 4, 11)


def _when(name: str, text: str) -> datetime:
    try:
        return min(max(datetime.fromisoformat(text), EARLIEST), LATEST)
    except ValueError:
        raise UsageError(f"{name} must be a date or date and time (e.g. 2026-01-31 or 2026-01-31T09:30, UTC), "
                         f"got {text!r}") from None


@dataclass
class RunsPage:
    """One page of runs, newest first."""

    rows: list[dict[str, Any]]
    total: int
    pages: int
    feedback: bool  # whether the store has a feedback table
    version: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def runs_page(store: Any, flt: RunFilter) -> RunsPage:
    """The page `flt` asks for, each run with its step count (and latest verdict, with feedback)."""
    feedback = has_table(store, "feedback", "run_id", "verdict")
    clause, params = flt.where(feedback)
    total = store.sql(f"SELECT count(*) FROM runs r {clause}", params).fetchall()[0][0]
    offset = (flt.page - 1) * flt.per_page
    verdict = ("(SELECT f.verdict FROM feedback f WHERE f.run_id = p.run_id ORDER BY rowid DESC LIMIT 1)"
               if feedback else "NULL")
    rel = store.sql(f"""
        WITH p AS (SELECT r.run_id, r.pipeline, r.status, r.error, r.started_at, r.ended_at, r.subject,
                          r.parent_run_id, r.query, json_extract_string(r.output, '$.answer') AS answer
                   FROM runs r {clause} ORDER BY r.started_at DESC, r.run_id LIMIT {int(flt.per_page)}
                   OFFSET {int(offset)}),
             n AS (SELECT s.run_id, count(*) AS steps FROM steps s WHERE s.run_id IN (SELECT run_id FROM p)
                   GROUP BY s.run_id)
        SELECT p.*, round(epoch_ns(p.ended_at - p.started_at) / 1e6, 3) AS duration_ms,
               coalesce(n.steps, 0) AS steps, {verdict} AS verdict
        FROM p LEFT JOIN n USING (run_id) ORDER BY p.started_at DESC, p.run_id""", params)
    cols = rel.columns
    rows = [dict(zip(cols, r)) for r in rel.fetchall()]
    return RunsPage(rows, total, max(1, -(-total // flt.per_page)), feedback, runs_version(store, flt, feedback))


def runs_version(store: Any, flt: RunFilter, feedback: Optional[bool] = None) -> str:
    """A token that changes when a run matching `flt` starts, ends or changes status."""
    if feedback is None:
        feedback = has_table(store, "feedback", "run_id", "verdict")
    clause, params = flt.where(feedback)
    row = store.sql(f"SELECT count(*), max(r.started_at), max(r.ended_at), "
                    f"count(*) FILTER (WHERE r.status IN ('running', 'paused')) FROM runs r {clause}",
                    params).fetchall()[0]
    return "|".join(str(v) for v in row)


def options(store: Any, limit: int = 200) -> dict[str, list[str]]:
    """Values to offer in the filters: pipelines, statuses and subjects seen (at most `limit` each)."""
    out: dict[str, list[str]] = {}
    for column in ("pipeline", "status", "subject"):
        out[column] = [r[0] for r in store.sql(
            f"SELECT DISTINCT {column} FROM runs WHERE {column} IS NOT NULL ORDER BY 1 LIMIT {int(limit)}"
        ).fetchall()]
    out["status"] = list(dict.fromkeys([*KNOWN_STATUSES, *out["status"]]))
    return out
