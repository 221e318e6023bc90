"""What every page shares: the templates and their filters, rendering with the common context,
links, the edit token, and the ASGI middleware that adds timing and security headers.

Stored text comes from models, users and tools, so templates autoescape everything, the pages
carry a Content-Security-Policy that allows no inline script and nothing from another origin
(every asset ships in the package), and a POST (an SQL query, a memory action) is taken only from
the viewer's own pages: the browser must say it is same-origin (`Sec-Fetch-Site`, else `Origin`),
and the form must carry the token the server put in it, which no other page can read. Pages name
the store by its label, never with a password from its URL.
"""
from __future__ import annotations

import hmac
import json
import os
import re
import time
from datetime import datetime, timezone
from typing import Any, Optional
from urllib.parse import quote, urlencode

import jinja2
from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import TracememError
from ..text import clip
from .source import Source

__all__ = ["HERE", "Forbidden", "Headers", "check_post", "check_token", "make_templates", "render", "run_url",
           "source"]

HERE = os.path.dirname(os.path.abspath(__file__))
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")


def _ts(value: Any) -> str:
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, int):  # ns since the epoch (steps)
        return datetime.fromtimestamp(value / 1e9, timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    return "" if value is None else str(value)


def _num(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".")
    return str(value)


def _json(value: Any) -> str:
    return json.dumps(value, indent=1, ensure_ascii=False, default=str)


STEP_ANCHOR = re.compile(r"#(?:step-|w-)(\d+)")
PROMPT_ANCHOR = re.compile(r"#ps-(.+)-\d+$")


def run_url(run_id: str, anchor: str = "") -> str:
    """The link to a run's page, or one of its pages (anchor '/backtrack'), or a place on it ('#step-3',
    '#w-3-1', '#ps-<prompt>-<idx>'): a place carries the step (or prompt) as `at`/`prompt`, so a long
    run opens on the page of steps that shows it."""
    base = f"/runs/{quote(run_id, safe='')}"
    step, prompt = STEP_ANCHOR.match(anchor), PROMPT_ANCHOR.match(anchor)
    if step:
        return f"{base}?at={step.group(1)}{anchor}"
    if prompt:
        return f"{base}?prompt={quote(prompt.group(1), safe='')}{anchor}"
    return base + anchor


def make_templates() -> Jinja2Templates:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(os.path.join(HERE, "templates")),
                             autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(short=lambda v: (v or "")[:8], ts=_ts, num=_num, clip=clip, pretty=_json,
                       urlq=lambda v: quote(str(v), safe=""), qs=lambda d: urlencode(d))
    env.globals.update(run_url=run_url)
    return Jinja2Templates(env=env)


def source(request: Request) -> Source:
    """The app's store source."""
    return request.app.state.source


def render(request: Request, name: str, status: int = 200, **context: Any) -> Response:
    """A page: `name` rendered with `context` and what every page shows (store, edit mode, note)."""
    state = request.app.state
    base = {"request": request, "db": state.source.label, "note": state.source.note, "allow_edit": state.allow_edit,
            "token": state.token, "version": state.source.served, "nav": name.split(".")[0]}
    return state.templates.TemplateResponse(request, name, {**base, **context}, status_code=status)


class Forbidden(TracememError):
    """A request another web page made the browser send (answered 403)."""


def check_token(request: Request, given: Optional[str]) -> None:
    """Refuse a POST that did not come from the viewer's own form."""
    if not hmac.compare_digest(str(given or ""), request.app.state.token):
        raise Forbidden("this form is stale or came from another page (missing or wrong token); reload the viewer's "
                        "page and try again")


def check_post(request: Request, token: Optional[str]) -> None:
    """Refuse a POST unless the browser says it came from the viewer's own origin and it carries the token."""
    site = request.headers.get("sec-fetch-site")
    origin = request.headers.get("origin")
    own = f"{request.url.scheme}://{request.headers.get('host', '')}"
    if site is not None and site != "same-origin":
        raise Forbidden(f"this request came from another site (Sec-Fetch-Site: {site}); the viewer only takes "
                        f"queries and changes from its own pages, so open {own}/ and use its forms")
    if site is None and origin is not None and origin != own:
        raise Forbidden(f"this request came from another origin ({origin}); the viewer only takes queries and "
                        f"changes from its own pages, so open {own}/ and use its forms")
    check_token(request, token)


class Headers:
    """ASGI middleware: `Server-Timing: app;dur=<ms>` (time to the response head) and security headers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers.append("Server-Timing", f"app;dur={(time.perf_counter() - start) * 1000:.2f}")
                headers.append("Content-Security-Policy", CSP)
                headers.append("X-Content-Type-Options", "nosniff")
                headers.append("Referrer-Policy", "no-referrer")
                headers.append("Cache-Control", "no-store")
            await send(message)

        await self.app(scope, receive, send_with_headers)
