"""The SQL console: read-only SQL over the store, as a table (capped, paginated) or as CSV.

Queries go through `store.sql` on the viewer's read-only store, which runs them fenced by the
database: DuckDB in its locked-down instance (store/read/user_sql.py: files, network, ATTACH, SET,
extensions and every change refused), PostgreSQL as the store's reader role in a READ ONLY
transaction (store/pg/reader.py); the page shows a refusal in words. Each query stops at the
viewer's time limit, and runs beside the other pages, never in their way (ui/source.py).

A query runs only when the console's own form posts it: a POST from the viewer's origin carrying
the page's token (ui/web.py `check_post`). A link or another site can fill the box (`GET /sql?q=`)
but never run it, so no web page the user visits can make their browser query the store. CSV cells
that a spreadsheet would take for a formula (starting with = + - @, or a tab or carriage return)
are prefixed with `'`.
"""
from __future__ import annotations

import csv
import io
import json
import math
from datetime import date, datetime
from typing import Any, Optional
from urllib.parse import parse_qs

import duckdb
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..errors import TracememError
from ..store.read.user_sql import QueryTimeout, ReadOnlySQLError, interrupted, refusal
from .web import check_post, render, source

__all__ = ["CSV_ROWS", "EXAMPLES", "MAX_ROWS", "PAGE_ROWS", "ROUTES", "cell", "csv_cell", "fetch"]

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


def fetch(store: Any, query: str, cap: int, timeout: float) -> tuple[list[str], list[tuple], bool]:
    """(columns, at most `cap` rows, whether more were cut) — or QueryFailed saying why."""
    try:
        rel = store.sql(query, timeout=timeout)
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
        if interrupted(err):
            raise QueryFailed(str(QueryTimeout(timeout)), False) from None
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


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> str:
    """A value as a CSV cell a spreadsheet shows as text: one it would read as a formula (`=HYPERLINK(…)`,
    `+1`, `@SUM`…) gets a leading `'` (numbers stay numbers)."""
    text = cell(value)
    if text.startswith(FORMULA_START) and not isinstance(value, (int, float)):
        return "'" + text
    return text


async def _form(request: Request) -> dict[str, str]:
    """The posted form, once the request is known to come from the console itself (check_post)."""
    form = {k: v[-1] for k, v in parse_qs((await request.body()).decode("utf-8", "replace")).items()}
    check_post(request, form.get("token"))
    return form


def _page(value: Optional[str]) -> int:
    try:
        return max(1, int(value or 1))
    except ValueError:
        return 1


def _run(request: Request, query: str, cap: int) -> tuple[list[str], list[tuple], bool]:
    src = source(request)
    with src.reading(user_sql=True) as store:
        return fetch(store, query, cap, src.timeout)


def sql_form(request: Request) -> Response:
    """GET: the console, its box filled from `q` (a link can fill it; only the form's POST runs it)."""
    query = (request.query_params.get("q") or "").strip()
    return _render(request, query, [], [], False, "", False, 1, ran=False)


async def sql_run(request: Request) -> Response:
    form = await _form(request)
    query = (form.get("q") or "").strip()
    cols: list[str] = []
    rows: list[tuple] = []
    cut, error, readonly = False, "", False
    if query:
        try:
            cols, rows, cut = await run_in_threadpool(_run, request, query, MAX_ROWS)
        except QueryFailed as err:
            error, readonly = str(err), err.readonly
    return _render(request, query, cols, rows, cut, error, readonly, _page(form.get("page")), ran=bool(query))


def _render(request: Request, query: str, cols: list[str], rows: list[tuple], cut: bool, error: str, readonly: bool,
            page: int, ran: bool) -> Response:
    pages = max(1, -(-len(rows) // PAGE_ROWS))
    page = min(page, pages)
    shown = [[(cell(v), v is None) for v in r] for r in rows[(page - 1) * PAGE_ROWS: page * PAGE_ROWS]]
    return render(request, "sql.html", status=400 if error else 200, query=query, cols=cols, rows=shown,
                  total=len(rows), cut=cut, page=page, pages=pages, error=error, readonly=readonly, ran=ran,
                  examples=EXAMPLES, limits={"page": PAGE_ROWS, "max": MAX_ROWS, "csv": CSV_ROWS,
                                             "seconds": source(request).timeout})


async def sql_csv(request: Request) -> Response:
    form = await _form(request)
    query = (form.get("q") or "").strip()
    try:
        cols, rows, cut = await run_in_threadpool(_run, request, query, CSV_ROWS) if query else ([], [], False)
    except QueryFailed as err:
        return Response(str(err) + "\n", status_code=400, media_type="text/plain")
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow([csv_cell(c) for c in cols])
    writer.writerows([csv_cell(v) for v in r] for r in rows)
    headers = {"Content-Disposition": 'attachment; filename="tracemem-query.csv"',
               "X-Tracemem-Rows": str(len(rows)), "X-Tracemem-Truncated": "true" if cut else "false"}
    return Response(out.getvalue(), media_type="text/csv; charset=utf-8", headers=headers)


def csv_get(request: Request) -> Response:
    return render(request, "error.html", status=405, title="Use the console",
                  message="a CSV is made by the SQL console's CSV button (a POST from its own page); open /sql, "
                          "run the query, then press CSV")


ROUTES = [Route("/sql", sql_form, methods=["GET"]), Route("/sql", sql_run, methods=["POST"]),
          Route("/sql.csv", sql_csv, methods=["POST"]), Route("/sql.csv", csv_get, methods=["GET"])]
