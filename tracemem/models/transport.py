"""One HTTP POST whose deadline covers the whole reply, with a size cap and safe redirects.

urllib's opener cannot do what a model call needs: a socket timeout bounds each read,
so a server trickling one byte a second never times out; it reads bodies of any size;
and it forwards ``Authorization`` to whatever host a redirect names. This module
builds on ``http.client`` (stdlib, so the core install stays light) and adds one
concern per piece: a watchdog that shuts the socket at the deadline, capped reads,
redirects that re-send the POST and drop credentials when they leave the origin,
and the environment's proxies (never for loopback hosts).
"""
from __future__ import annotations

import base64
import http.client
import ipaddress
import socket
import ssl
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Callable, Optional, TypeVar

from tracemem.errors import TracememError

from .errors import ModelConfigError

REDIRECTS = (301, 302, 303, 307, 308)
READ_BLOCK = 65536
T = TypeVar("T")


class TransportError(TracememError):
    """An HTTP exchange failed below the level of a model reply (the adapter says which model)."""


class TransportTimeout(TransportError):
    """The deadline passed before the exchange finished."""


class TransportConnectionError(TransportError):
    """The server could not be reached, or the connection broke mid-reply."""


class TransportTooLarge(TransportError):
    """The body is larger than the limit the reader set."""

    def __init__(self, limit: int, seen: int) -> None:
        super().__init__(f"body exceeds {limit} bytes (read {seen} so far)")
        self.limit, self.seen = limit, seen


class TransportRedirectError(TransportError):
    """Too many redirects, or a redirect without a usable Location."""


@dataclass(frozen=True)
class Endpoint:
    """A URL split into what we connect to and the credentials it carried (``user:password@``).

    ``url`` has the credentials removed; ``safe_url`` is what errors and reprs show.
    """

    url: str
    safe_url: str
    username: Optional[str] = None
    password: Optional[str] = None

    @classmethod
    def parse(cls, raw: str) -> "Endpoint":
        try:
            parts = urllib.parse.urlsplit(raw)
            port = parts.port  # raises ValueError for a non-numeric port
        except ValueError:
            raise ModelConfigError(f"base_url {redact_userinfo(raw)!r} is not a valid URL; "
                                   "use e.g. http://localhost:8000/v1") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ModelConfigError(f"base_url {redact_userinfo(raw)!r} must be an http:// or https:// URL with a host, "
                                   "e.g. http://localhost:8000/v1")
        host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
        netloc = host if port is None else f"{host}:{port}"
        clean = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))
        if parts.username is None and parts.password is None:
            return cls(clean, clean)
        safe = urllib.parse.urlunsplit((parts.scheme, f"***@{netloc}", parts.path, parts.query, ""))
        return cls(clean, safe, urllib.parse.unquote(parts.username or ""),
                   urllib.parse.unquote(parts.password) if parts.password is not None else None)

    def basic_auth(self) -> Optional[str]:
        """The ``Authorization: Basic`` value for the URL's credentials, if it had any."""
        if self.username is None and self.password is None:
            return None
        pair = f"{self.username or ''}:{self.password or ''}".encode()
        return "Basic " + base64.b64encode(pair).decode("ascii")


def redact_userinfo(url: str) -> str:
    """``scheme://***@host/...`` for a URL carrying ``user:password@``; other text unchanged."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, tail = rest.partition("/")
    if "@" not in authority:
        return url
    return f"{scheme}://***@{authority.rpartition('@')[2]}{slash}{tail}"


def is_loopback(url: str) -> bool:
    """True for localhost URLs, which never go through an HTTP(S)_PROXY."""
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def origin(url: str) -> tuple[str, str, int]:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port or (443 if parts.scheme == "https" else 80)


class Response:
    """The status and headers of a reply, and its body read under the exchange's deadline.

    ``abort()`` may be called from any thread: it shuts the socket, so a blocked read
    returns at once. ``close()`` also stops the watchdog; call it (or use ``with``).
    """

    def __init__(self, exchange: "_Exchange", resp: http.client.HTTPResponse, url: str) -> None:
        self._exchange, self._resp = exchange, resp
        self.status, self.headers, self.url = resp.status, resp.headers, url

    def __enter__(self) -> "Response":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def blocks(self) -> Iterator[bytes]:
        """The body as it arrives, one socket read at a time."""
        while True:
            block = self._exchange.io(self._resp.read1, READ_BLOCK)
            if not block:
                self._exchange.check_deadline()
                missing = getattr(self._resp, "length", None)
                if missing:  # Content-Length promised more: the connection broke
                    raise TransportConnectionError(f"connection closed with {missing} bytes of the body missing")
                return
            yield block

    def read(self, limit: int) -> bytes:
        """The whole body; more than ``limit`` bytes raises TransportTooLarge (and drops the connection)."""
        declared = self.headers.get("Content-Length")
        if declared and declared.isdigit() and int(declared) > limit:
            self.abort()
            raise TransportTooLarge(limit, 0)
        chunks, total = [], 0
        for block in self.blocks():
            total += len(block)
            if total > limit:
                self.abort()
                raise TransportTooLarge(limit, total)
            chunks.append(block)
        return b"".join(chunks)

    def abort(self) -> None:
        self._exchange.shut()

    def close(self) -> None:
        self._exchange.close()


class _Exchange:
    """One request's connections (one per redirect hop) and the watchdog that ends them at the deadline."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.expired = False
        self._conn: Optional[http.client.HTTPConnection] = None
        self._sock: Optional[socket.socket] = None  # kept: http.client drops conn.sock once a response owns it
        self._lock = threading.Lock()
        self._timer = threading.Timer(timeout, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def _expire(self) -> None:
        self.expired = True
        self.shut()

    def shut(self) -> None:
        """Shut the current socket down so any blocked read in another thread returns now."""
        with self._lock:
            sock = self._sock
        if sock is not None:
            try:  # the plain socket's shutdown: SSLSocket.shutdown would unwrap under a reader's feet
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass

    def use(self, conn: Optional[http.client.HTTPConnection]) -> None:
        """Make ``conn`` the current connection, closing the previous hop's."""
        with self._lock:
            old, self._conn, self._sock = self._conn, conn, None
        if old is not None:
            old.close()

    def connected(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._sock = conn.sock
        if self.expired:
            self.shut()

    def remaining(self) -> float:
        return max(self.deadline - time.monotonic(), 0.001)

    def check_deadline(self) -> None:
        if self.expired or time.monotonic() >= self.deadline:
            raise TransportTimeout(f"no complete reply within timeout={self.timeout}s")

    def io(self, fn: Callable[..., T], *args: Any) -> T:
        """Run one blocking step; every failure becomes a TransportError (timeout if the deadline passed)."""
        try:
            result = fn(*args)
        except (TimeoutError, socket.timeout) as err:
            raise TransportTimeout(f"no complete reply within timeout={self.timeout}s") from err
        except (http.client.HTTPException, OSError, ValueError, AttributeError) as err:
            # AttributeError: http.client reading a response whose socket was shut under it
            self.check_deadline()
            raise TransportConnectionError(f"{type(err).__name__}: {err}" if str(err) else type(err).__name__) from err
        if self.expired:
            raise TransportTimeout(f"no complete reply within timeout={self.timeout}s")
        return result

    def close(self) -> None:
        self._timer.cancel()
        self.use(None)


class Transport:
    """POSTs JSON to one base URL's host, following redirects safely, through the proxies in the environment."""

    def __init__(self, *, use_proxies: bool = True, max_redirects: int = 5) -> None:
        self.proxies = urllib.request.getproxies() if use_proxies else {}
        self.max_redirects = max_redirects
        self._tls = ssl.create_default_context()

    def post(self, url: str, body: bytes, headers: Mapping[str, str], *, timeout: float,
             credentials: Mapping[str, str]) -> Response:
        """Send ``body``; ``credentials`` (e.g. Authorization) go only to ``url``'s own origin.

        Redirects (301/302/303/307/308) re-send the same POST: a chat request turned
        into a GET, as browsers do, is meaningless. The deadline covers every hop.
        """
        exchange = _Exchange(timeout)
        home = origin(url)
        try:
            for _ in range(self.max_redirects + 1):
                sent = {**headers, **(credentials if origin(url) == home else {})}
                resp = self._send(exchange, url, body, sent)
                location = resp.getheader("Location") if resp.status in REDIRECTS else None
                if location is None:
                    return Response(exchange, resp, url)
                target = urllib.parse.urljoin(url, location)
                if urllib.parse.urlsplit(target).scheme not in ("http", "https"):
                    raise TransportRedirectError(f"redirected to {redact_userinfo(target)!r}, which is not http(s)")
                url = target
            raise TransportRedirectError(f"more than {self.max_redirects} redirects (last to {redact_userinfo(url)})")
        except BaseException:
            exchange.close()
            raise

    def _send(self, exchange: _Exchange, url: str, body: bytes, headers: dict[str, str]) -> http.client.HTTPResponse:
        parts = urllib.parse.urlsplit(url)
        host, port = parts.hostname or "", parts.port
        path = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
        proxy = None if is_loopback(url) or urllib.request.proxy_bypass(host) else self.proxies.get(parts.scheme)
        timeout = exchange.remaining()
        if proxy:
            pp = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
            proxy_auth = Endpoint.parse(proxy if "://" in proxy else f"http://{proxy}").basic_auth()
            tunnel = {"Proxy-Authorization": proxy_auth} if proxy_auth else None
            if parts.scheme == "https":
                conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                    pp.hostname or "", pp.port or 80, timeout=timeout, context=self._tls)
                conn.set_tunnel(host, port, headers=tunnel)
            else:
                conn = http.client.HTTPConnection(pp.hostname or "", pp.port or 80, timeout=timeout)
                path = urllib.parse.urlunsplit(("http", parts.netloc.rpartition("@")[2], parts.path or "/",
                                                parts.query, ""))
                headers = {**headers, **(tunnel or {})}
        elif parts.scheme == "https":
            conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=self._tls)
        else:
            conn = http.client.HTTPConnection(host, port, timeout=timeout)
        exchange.use(conn)
        exchange.io(conn.connect)
        exchange.connected(conn)
        exchange.io(conn.request, "POST", path, body, headers)
        return exchange.io(conn.getresponse)
