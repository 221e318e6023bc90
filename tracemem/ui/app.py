"""`create_app`: the viewer's ASGI app (Starlette) over one store file, and `serve` to run it.

Each page lives in its own module with its `ROUTES`; this module puts them together with the
static assets, the middleware (timing and security headers, and the Host check that keeps
another web page from reaching the viewer through DNS rebinding) and one error page: an error a
user can act on is shown with its message, never as a traceback.
"""
from __future__ import annotations

import os
import secrets
import socket
from typing import Any, Callable, Optional, Sequence

import duckdb
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from ..errors import TracememError, UsageError
from ..memory.errors import MemoryNotFoundError
from ..store import StoreLockedError
from . import backtrack_page, memory_page, run_page, runs_page, sql_page
from .source import Source
from .web import HERE, Headers, make_templates, render

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
    if isinstance(err, StoreLockedError):
        return 409, "The store is busy"
    if isinstance(err, UsageError):
        return 400, "Bad request"
    if isinstance(err, TracememError):
        return 400, "Cannot show this"
    return 500, "Store error"


async def _error(request: Request, err: Exception) -> Response:
    status, title = _status(err)
    message = str(err).strip() or type(err).__name__
    return render(request, "error.html", status=status, title=title, message=message)


def create_app(db: str, *, allow_edit: bool = False, hosts: Sequence[str] = ("*",), refresh: float = 3.0,
               source: Optional[Source] = None) -> Starlette:
    """The viewer over store file `db`: read-only (memory actions only with `allow_edit`), answering
    requests whose Host is one of `hosts`."""
    routes: list[Any] = [*runs_page.ROUTES, *backtrack_page.ROUTES, *run_page.ROUTES, *memory_page.ROUTES,
                         *sql_page.ROUTES, Mount("/static", StaticFiles(directory=os.path.join(HERE, "static")),
                                                 name="static")]
    handlers: dict[Any, Callable[..., Any]] = {TracememError: _error, duckdb.Error: _error}
    app = Starlette(routes=routes, exception_handlers=handlers,
                    middleware=[Middleware(Headers), Middleware(TrustedHostMiddleware, allowed_hosts=list(hosts))])
    app.state.source = source or Source(db, refresh=refresh)
    app.state.allow_edit = allow_edit
    app.state.token = secrets.token_urlsafe(24)
    app.state.templates = make_templates()
    return app


def serve(db: str, *, host: str = "127.0.0.1", port: int = 8765, allow_edit: bool = False,
          announce: Callable[[str], None] = print) -> None:
    """Check the store opens, bind `host:port` (0: any free port), say the URL, and serve until stopped."""
    import uvicorn

    source = Source(db)
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
    app = create_app(db, allow_edit=allow_edit, hosts=local_hosts(host), source=source)
    mode = "memory actions allowed (--allow-edit)" if allow_edit else "read-only"
    announce(f"tracemem ui: {db} at http://{shown}:{bound}/ ({mode}; Ctrl-C to stop)")
    if host not in LOOPBACK:
        announce(f"warning: listening on {host}: anyone who can reach this address can read the store")
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        source.close()
        sock.close()
