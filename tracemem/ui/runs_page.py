"""The runs page: filters, pages, and new runs appearing while an agent writes.

The page polls `/api/runs/changes` with the file version it was rendered from; the answer is
"unchanged" from a `stat()` alone, without opening DuckDB, until an agent writes. Then the
page fetches its table body again (`/runs/rows`), so new runs and finished ones show up.
"""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from .queries import RunFilter, options, runs_page, runs_version
from .source import file_version
from .web import render, source

__all__ = ["ROUTES"]


def home(request: Request) -> Response:
    return RedirectResponse("/runs", status_code=302)


def runs(request: Request) -> Response:
    flt = RunFilter.from_query(request.query_params)
    src = source(request)
    with src.reading() as store:
        page = runs_page(store, flt)
        choices = src.memo("options", lambda: options(store))
    return render(request, "runs.html", flt=flt, page=page, choices=choices)


def rows(request: Request) -> Response:
    flt = RunFilter.from_query(request.query_params)
    with source(request).reading() as store:
        page = runs_page(store, flt)
    return render(request, "runs_rows.html", flt=flt, page=page)


def changes(request: Request) -> Response:
    src = source(request)
    if request.query_params.get("v") == file_version(src.path):
        return JSONResponse({"changed": False})
    flt = RunFilter.from_query(request.query_params)
    with src.reading() as store:
        token = runs_version(store, flt)
    return JSONResponse({"changed": True, "version": src.served, "runs": token})


ROUTES = [Route("/", home), Route("/runs", runs), Route("/runs/rows", rows),
          Route("/api/runs/changes", changes)]
