"""`create_app`: the viewer's ASGI app (Starlette) over one store file, and `serve` to run it.

Each page lives in its own module with its `ROUTES`; this module puts them together with the
static assets, the middleware (timing and security headers, and the Host check that keeps
another web page from reaching the viewer through DNS rebinding) and one error page: an error a
user can act on is shown with its message, a page that ran past its time limit says so, and
anything else is named by its kind, never shown as a traceback or a bare 500.
"""
from __future__ import annotations

import os
import secrets
import socket
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable, Optional, Sequence

import duckdb
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from ..errors import TracememError, UsageError
from ..memory.errors import MemoryNotFoundError
from ..store import StoreLockedError
from ..store.snapshot_dirs import clean_stale
from ..store.read.user_sql import QueryTimeout, interrupted
from . import backtrack_page, memory_page, run_page, runs_page, sql_page
from .limits import TimedOut
from .source import Source
from .web import HERE, Forbidden, Headers, make_templates, render

__all__ = ["create_app", "local_hosts", "serve"]

LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


def local_hosts(host: str) -> list[str]:
    """The Host headers the viewer answers: the loopback names, or anything when bound to every address."""
    if host in ("0.0.0.0", "::", ""):
        return ["*"]
    return list(dict.fromkeys([*LOOPBACK, host]))


def _status(err: Exception) -> tuple[int, str]:
    if isinstance(err, MemoryNotFoundError) or (isinstance(err, TracememError) and str(err).startswith("no run")):
        return 404, "Not found"
    if isinstance(err, Forbidden):
        return 403, "Refused"
    if isinstance(err, (TimedOut, QueryTimeout)):
        return 503, "Took too long"
    if isinstance(err, StoreLockedError):
        return 409, "The store is busy"
    if isinstance(err, UsageError):
        return 400, "Bad request"
    if isinstance(err, TracememError):
        return 400, "Cannot show this"
    return 500, "Store error" if isinstance(err, duckdb.Error) else "Internal error"


def _timed_out(err: Exception, seconds: float) -> Exception:
    """The time limit's cancellation (DuckDB's interrupt, PostgreSQL's statement timeout) as `TimedOut`."""
    if (isinstance(err, duckdb.Error) and interrupted(err)) or "statement timeout" in str(err):
        return TimedOut(seconds)
    return err


async def _error(request: Request, err: Exception) -> Response:
    err = _timed_out(err, request.app.state.source.timeout)
    status, title = _status(err)
    if isinstance(err, (TracememError, duckdb.Error)):
        message = str(err).strip() or type(err).__name__
    else:  # a fault of the viewer's own: its kind only (a message might quote what the page should not show)
        message = f"the viewer failed on this page ({type(err).__name__}); the store is unchanged"
    return render(request, "error.html", status=status, title=title, message=message)


@asynccontextmanager
async def _lifespan(app: Starlette) -> AsyncIterator[None]:
    """The server's shutdown (Ctrl-C, SIGTERM) closes the store's snapshot copy: uvicorn re-raises the signal
    once the server has stopped, which ends the process before code after `Server.run` would run."""
    yield
    app.state.source.close()


async def _http_error(request: Request, err: HTTPException) -> Response:
    """Starlette's own refusals (no such page, a method a page does not take) on the error page."""
    title = "Not found" if err.status_code == 404 else "Bad request"
    message = f"there is no page {request.url.path}" if err.status_code == 404 else err.detail
    return render(request, "error.html", status=err.status_code, title=title, message=message)


def create_app(db: str, *, allow_edit: bool = False, hosts: Sequence[str] = ("*",), refresh: float = 3.0,
               source: Optional[Source] = None, timeout: float = 10.0) -> Starlette:
    """The viewer over store `db`: read-only (memory actions only with `allow_edit`), answering requests whose
    Host is one of `hosts`; every query a page runs stops after `timeout` seconds."""
    routes: list[Any] = [*runs_page.ROUTES, *backtrack_page.ROUTES, *run_page.ROUTES, *memory_page.ROUTES,
                         *sql_page.ROUTES, Mount("/static", StaticFiles(directory=os.path.join(HERE, "static")),
                                                 name="static")]
    handlers: dict[Any, Callable[..., Any]] = {TracememError: _error, duckdb.Error: _error, Exception: _error,
                                               HTTPException: _http_error}
    app = Starlette(routes=routes, exception_handlers=handlers, lifespan=_lifespan,
                    middleware=[Middleware(Headers), Middleware(TrustedHostMiddleware, allowed_hosts=list(hosts))])
    app.state.source = source or Source(db, refresh=refresh, timeout=timeout)
    app.state.allow_edit = allow_edit
    app.state.token = secrets.token_urlsafe(24)
    app.state.templates = make_templates()
    return app


def serve(db: str, *, host: str = "127.0.0.1", port: int = 8765, allow_edit: bool = False, timeout: float = 10.0,
          announce: Callable[[str], None] = print) -> None:
    """Check the store opens, bind `host:port` (0: any free port), say the URL, and serve until stopped."""
    import uvicorn

    clean_stale()  # snapshot copies a viewer (or any reader) killed earlier left in the temporary directory
    source = Source(db, timeout=timeout)
    source.check()
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)  # connections queue from now on, before the server loop starts
    except OSError as err:
        sock.close()
        raise TracememError(f"cannot listen on {host}:{port} ({err.strerror}); pick another port with --port N "
                            f"(0 picks a free one)") from None
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    app = create_app(db, allow_edit=allow_edit, hosts=local_hosts(host), source=source, timeout=timeout)
    mode = "memory actions allowed (--allow-edit)" if allow_edit else "read-only"
    announce(f"tracemem ui: {source.label} at http://{shown}:{bound}/ ({mode}; Ctrl-C to stop)")
    if host not in LOOPBACK:
        announce(f"warning: listening on {host}: anyone who can reach this address can read the store")
    # on Ctrl-C or SIGTERM, requests get a moment to finish; then the shutdown stops their queries (_lifespan)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on", timeout_graceful_shutdown=2)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        source.close()
        sock.close()
