"""The SQL console: read-only SQL over the store, as a table (capped, paginated) or as CSV.

Queries go through `store.sql` on the viewer's read-only store, which runs them in the fenced
DuckDB instance (store/user_sql.py): files, network, ATTACH, SET, extensions and every change
are refused by DuckDB itself, and the page shows the refusal in words. The query is part of the
URL, so a result can be linked to and downloaded.
"""
from __future__ import annotations

import csv
import io
import json
import math
from datetime import date, datetime
from typing import Any, Optional

import duckdb
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..errors import TracememError
from ..store.user_sql import ReadOnlySQLError, refusal
from .web import render, source

__all__ = ["CSV_ROWS", "EXAMPLES", "MAX_ROWS", "PAGE_ROWS", "ROUTES", "cell", "fetch"]

PAGE_ROWS, MAX_ROWS, CSV_ROWS = 100, 10_000, 100_000
EXAMPLES = [
    ("runs by status", "SELECT pipeline, status, count(*) AS runs FROM runs GROUP BY ALL ORDER BY runs DESC"),
    ("slowest stages", "SELECT stage, count(*) AS n, round(avg(epoch_ms(ended_at) - epoch_ms(started_at)), 2) AS "
                       "avg_ms FROM steps GROUP BY stage ORDER BY avg_ms DESC"),
    ("memories injected", "SELECT u.run_id, m.memory_id, m.text, m.review_state FROM memory_uses u "
                          "JOIN memories m USING (memory_id) WHERE u.outcome = 'injected' ORDER BY u.run_id"),
    ("model tokens", "SELECT model, count(*) AS calls, sum(input_tokens) AS tokens_in, "
                     "sum(output_tokens) AS tokens_out FROM model_calls GROUP BY model"),
]


class QueryFailed(TracememError):
    """A query of the console failed; `readonly` is True when the fence refused it."""

    def __init__(self, message: str, readonly: bool) -> None:
        super().__init__(message)
        self.readonly = readonly


def fetch(store: Any, query: str, cap: int) -> tuple[list[str], list[tuple], bool]:
    """(columns, at most `cap` rows, whether more were cut) — or QueryFailed saying why."""
    try:
        rel = store.sql(query)
        if rel is None:
            return [], [], False
        rows = rel.limit(cap + 1).fetchall()
        return list(rel.columns), rows[:cap], len(rows) > cap
    except ReadOnlySQLError as err:
        raise QueryFailed(f"read-only: {err.refused}. The viewer never changes the store through SQL; use "
                          f"`tracemem sql --write` or Store(path) for that.", True) from None
    except TracememError as err:
        raise QueryFailed(str(err), False) from None
    except duckdb.Error as err:  # raised while fetching: DuckDB runs a SELECT lazily
        refused = refusal(query, err)
        if refused is not None:
            raise QueryFailed(f"read-only: {refused}.", True) from None
        raise QueryFailed(f"SQL error: {str(err).splitlines()[0]}", False) from None


def cell(value: Any) -> str:
    """One value as the table and the CSV show it (NULL is empty in CSV, marked in the table)."""
    if value is None:
        return ""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (datetime, date)):
        return value.isoformat(sep=" ") if isinstance(value, datetime) else value.isoformat()
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, ensure_ascii=False, default=str)
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    return str(value)


def sql_page(request: Request) -> Response:
    query = (request.query_params.get("q") or "").strip()
    try:
        page = max(1, int(request.query_params.get("page") or 1))
    except ValueError:
        page = 1
    cols: list[str] = []
    rows: list[tuple] = []
    cut, error, readonly = False, "", False
    if query:
        with source(request).reading() as store:
            try:
                cols, rows, cut = fetch(store, query, MAX_ROWS)
            except QueryFailed as err:
                error, readonly = str(err), err.readonly
    pages = max(1, -(-len(rows) // PAGE_ROWS))
    page = min(page, pages)
    shown = [[(cell(v), v is None) for v in r] for r in rows[(page - 1) * PAGE_ROWS: page * PAGE_ROWS]]
    return render(request, "sql.html", status=400 if error else 200, query=query, cols=cols, rows=shown,
                  total=len(rows), cut=cut, page=page, pages=pages, error=error, readonly=readonly,
                  examples=EXAMPLES, limits={"page": PAGE_ROWS, "max": MAX_ROWS, "csv": CSV_ROWS})


def sql_csv(request: Request) -> Response:
    query = (request.query_params.get("q") or "").strip()
    error: Optional[str] = None
    with source(request).reading() as store:
        try:
            cols, rows, cut = fetch(store, query, CSV_ROWS) if query else ([], [], False)
        except QueryFailed as err:
            error = str(err)
    if error is not None:
        return Response(error + "\n", status_code=400, media_type="text/plain")
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(cols)
    writer.writerows([cell(v) for v in r] for r in rows)
    headers = {"Content-Disposition": 'attachment; filename="tracemem-query.csv"',
               "X-Tracemem-Rows": str(len(rows)), "X-Tracemem-Truncated": "true" if cut else "false"}
    return Response(out.getvalue(), media_type="text/csv; charset=utf-8", headers=headers)


ROUTES = [Route("/sql", sql_page), Route("/sql.csv", sql_csv)]
