"""The viewer's own SQL over the public tables, and the runs list: filters, a page, the total, a change token.

`store.runs()` answers "the newest N runs"; the viewer also needs an offset, an id prefix, the
question and answer of each run, feedback, and a count, so it queries the documented tables
(`runs`, `steps`, `feedback`...). The `feedback` table comes with the accountability work and may
be missing: its filter and column appear only when it exists.

`rows()` runs these fixed, parameterised SELECTs on the connection tracemem reads with
(store/read/own_sql.py), which a read-only Store opens read-only (DuckDB refuses any change on it).
`store.sql()` on a read-only store runs in a second, fenced DuckDB instance (store/read/user_sql.py)
because its SQL is typed by a person; the viewer sends SQL a person typed only there (the SQL page).
Building the fence costs a new DuckDB instance attaching the file, about 80 ms, and the viewer opens
the store for every request (it must not hold the file: see source.py), so its own queries skip it.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, Mapping, Optional, Sequence

from ..errors import TracememError, UsageError
from ..store.read.own_sql import own_rows

__all__ = ["KNOWN_STATUSES", "RunFilter", "RunsPage", "has_table", "options", "resolve", "rows", "runs_page", "runs_version"]

KNOWN_STATUSES = ("ok", "failed", "running", "paused", "interrupted")
FEEDBACK_CHOICES = ("any", "none", "wrong", "right")


def rows(store: Any, query: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
    """The rows of one of the viewer's own SELECTs, as dicts (see the module docstring), on the connection
    tracemem reads with, which the page's time limit watches (ui/limits.py)."""
    columns, found = own_rows(store, query, params)
    return [dict(zip(columns, r)) for r in found]


def resolve(store: Any, ref: str) -> str:
    """A full run id from a unique prefix, as the CLI takes them."""
    found = [r["run_id"] for r in rows(store, "SELECT run_id FROM runs WHERE starts_with(run_id, ?) "
                                              "ORDER BY run_id = ? DESC LIMIT 3", [ref, ref])]
    if not found:
        raise TracememError(f"no run '{ref}' in {store.snapshot_of or store.path}; see the runs page")
    if found[0] != ref and len(found) > 1:
        raise UsageError(f"run prefix '{ref}' is ambiguous ({', '.join(found)}…); give more characters")
    return found[0]


def has_table(store: Any, table: str, *columns: str) -> bool:
    """Whether the store has `table` (with every one of `columns`)."""
    have = {r["column_name"] for r in rows(store, "SELECT column_name FROM information_schema.columns "
                                                  "WHERE table_name = ? AND table_schema = current_schema()", [table])}
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
            if f.name in ("page", "per_page"):
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
    total = rows(store, f"SELECT count(*) AS n FROM runs r {clause}", params)[0]["n"]
    offset = (flt.page - 1) * flt.per_page
    page = rows(store, f"""
        SELECT r.run_id, r.pipeline, r.status, r.error, r.started_at, r.ended_at, r.subject, r.parent_run_id,
               r.query, json_extract_string(r.output, '$.answer') AS answer,
               round(epoch_ns(r.ended_at - r.started_at) / 1e6, 3) AS duration_ms
        FROM runs r {clause} ORDER BY r.started_at DESC, r.run_id LIMIT {int(flt.per_page)} OFFSET {int(offset)}""",
                params)
    _page_details(store, page, feedback)
    return RunsPage(page, total, max(1, -(-total // flt.per_page)), feedback, runs_version(store, flt, feedback))


def _page_details(store: Any, page: list[dict[str, Any]], feedback: bool) -> None:
    """Each run of a page with its step count, tokens, how it was started (kind and parent), and latest verdict
    (with who gave it): queries over the page's runs only (a short IN list)."""
    ids = [r["run_id"] for r in page]
    marks = ", ".join("?" * len(ids))
    by_id: dict[str, dict[str, Any]] = {r["run_id"]: {} for r in page}
    if ids:
        for r in rows(store, f"SELECT run_id, count(*) AS n FROM steps WHERE run_id IN ({marks}) GROUP BY run_id", ids):
            by_id[r["run_id"]]["steps"] = r["n"]
        if has_table(store, "model_calls", "input_tokens", "output_tokens"):
            for r in rows(store, f"SELECT run_id, count(*) AS calls, sum(input_tokens) AS tin, sum(output_tokens) AS tout "
                                 f"FROM model_calls WHERE run_id IN ({marks}) GROUP BY run_id", ids):
                by_id[r["run_id"]].update(calls=r["calls"], tokens_in=r["tin"], tokens_out=r["tout"])
        if has_table(store, "runs", "kind", "forked_from_run_id"):
            for r in rows(store, f"SELECT run_id, kind, forked_from_run_id FROM runs WHERE run_id IN ({marks})", ids):
                by_id[r["run_id"]].update(kind=r["kind"], forked_from=r["forked_from_run_id"])
        if feedback:  # the latest verdict (a window, not arg_max: the same SQL runs on PostgreSQL)
            for r in rows(store, f"SELECT run_id, verdict, \"by\" AS judge FROM (SELECT run_id, verdict, \"by\", "
                                 f"row_number() OVER (PARTITION BY run_id ORDER BY \"at\" DESC) AS nth FROM feedback "
                                 f"WHERE run_id IN ({marks})) latest WHERE nth = 1", ids):
                by_id[r["run_id"]].update(verdict=r["verdict"], judge=r["judge"])
    for r in page:
        extra = by_id[r["run_id"]]
        r["steps"] = extra.get("steps", 0)
        for key in ("calls", "tokens_in", "tokens_out", "kind", "forked_from", "verdict", "judge"):
            r[key] = extra.get(key)


def runs_version(store: Any, flt: RunFilter, feedback: Optional[bool] = None) -> str:
    """A token that changes when a run matching `flt` starts, ends or changes status."""
    if feedback is None:
        feedback = has_table(store, "feedback", "run_id", "verdict")
    clause, params = flt.where(feedback)
    row = rows(store, f"SELECT count(*) AS n, max(r.started_at) AS s, max(r.ended_at) AS e, "
                      f"count(*) FILTER (WHERE r.status IN ('running', 'paused')) AS live FROM runs r {clause}",
               params)[0]
    return "|".join(str(v) for v in row.values())


def options(store: Any, limit: int = 200) -> dict[str, list[str]]:
    """Values to offer in the filters: pipelines, statuses and subjects seen (at most `limit` each)."""
    out: dict[str, list[str]] = {}
    for column in ("pipeline", "status", "subject"):
        out[column] = [r["v"] for r in rows(
            store, f"SELECT DISTINCT {column} AS v FROM runs WHERE {column} IS NOT NULL ORDER BY 1 LIMIT {int(limit)}")]
    out["status"] = list(dict.fromkeys([*KNOWN_STATUSES, *out["status"]]))
    return out
