"""The adapter under a hostile or broken server, against real local HTTP servers."""
from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

import pytest

from openai_server import Completion, OpenAIServer
from tracemem.errors import TracememError
from tracemem.models import MAX_REPLY_BYTES, ModelConfigError, ModelError, OpenAICompatibleModel, Usage, usage_count

Q = [{"role": "user", "content": "hello"}]


@pytest.fixture
def server():
    with OpenAIServer() as s:
        yield s


@pytest.fixture
def other():
    with OpenAIServer() as s:
        yield s


def model(url: str, **kw: Any) -> OpenAICompatibleModel:
    return OpenAICompatibleModel(url, "m1", backoff=0.01, **kw)


# --- redirects -------------------------------------------------------------------------------


def test_a_redirect_to_another_host_does_not_forward_authorization(server, other):
    server.redirect(f"http://localhost:{other.port}/v1/chat/completions", status=302)
    other.reply(text="from the other host")
    reply = model(server.url, api_key="sk-top-secret").complete(Q)
    assert reply.text == "from the other host"
    assert server.requests[0]["headers"]["Authorization"] == "Bearer sk-top-secret"
    moved = other.requests[0]
    assert "Authorization" not in moved["headers"] and moved["body"]["messages"] == Q  # the POST was re-sent


def test_url_credentials_are_not_forwarded_across_origins_either(server, other):
    server.redirect(f"{other.origin}/v1/chat/completions", status=307)
    other.reply(text="ok")
    model(server.url.replace("http://", "http://dana:pw-1234@")).complete(Q)
    assert server.requests[0]["headers"]["Authorization"].startswith("Basic ")
    assert "Authorization" not in other.requests[0]["headers"]


def test_a_same_origin_redirect_keeps_authorization(server):
    server.redirect("/v2/chat/completions", status=308)
    server.reply(text="moved")
    assert model(server.url, api_key="sk-1").complete(Q).text == "moved"
    assert [r["path"] for r in server.requests] == ["/v1/chat/completions", "/v2/chat/completions"]
    assert server.requests[1]["headers"]["Authorization"] == "Bearer sk-1"


def test_a_redirect_loop_is_a_clear_error(server):
    server.redirect("/v1/chat/completions")
    with pytest.raises(ModelError, match="more than 2 redirects") as info:
        model(server.url, max_redirects=2).complete(Q)
    assert info.value.kind == "redirect" and len(server.requests) == 3


# --- timeouts cover the whole reply ----------------------------------------------------------


def test_a_server_trickling_its_reply_cannot_outlast_the_timeout(server):
    server.respond(body=Completion(text="x" * 200).body(), trickle=0.02)  # ~5 s byte by byte
    start = time.monotonic()
    with pytest.raises(ModelError) as info:
        model(server.url, timeout=0.5).complete(Q)
    assert info.value.kind == "timeout" and "timeout=0.5" in str(info.value)
    assert time.monotonic() - start < 2.0
    assert len(server.requests) == 1  # timeouts are not retried


def test_a_server_trickling_its_headers_cannot_outlast_the_timeout():
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def trickle() -> None:
        conn, _ = listener.accept()
        conn.recv(65536)
        try:
            for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 500:
                conn.send(bytes([byte]))
                time.sleep(0.02)
        except OSError:
            pass
        conn.close()

    worker = threading.Thread(target=trickle, daemon=True)
    worker.start()
    start = time.monotonic()
    with pytest.raises(ModelError) as info:
        model(f"http://127.0.0.1:{port}/v1", timeout=0.4).complete(Q)
    assert info.value.kind == "timeout" and time.monotonic() - start < 2.0
    worker.join(timeout=15)
    listener.close()


# --- usage counts ----------------------------------------------------------------------------


@pytest.mark.parametrize("value, expected", [
    (7, 7), (7.0, 7), (0, 0), (2**31 - 1, 2**31 - 1),
    (2**31, None), (10**12, None), (10**400, None), (-1, None), (1.5, None), (float("inf"), None),
    ("7", None), ("seven", None), (True, None), (None, None), ([1], None), ({"n": 1}, None),
])
def test_usage_count_never_guesses_never_raises(value, expected):
    assert usage_count(value) == expected


def test_bad_usage_from_a_server_is_recorded_as_unknown(server):
    body = Completion(text="ok").body()
    raw = json.dumps(body)[:-1] + ', "usage": {"prompt_tokens": 1e400, "completion_tokens": 99999999999999999999}}'
    server.respond(body=raw.encode())
    server.reply(text="ok", usage={"prompt_tokens": "twelve", "completion_tokens": 3})
    assert model(server.url).complete(Q).usage == Usage(None, None)
    assert model(server.url).complete(Q, on_token=lambda t: None).usage == Usage(None, 3)


# --- reply size cap ----------------------------------------------------------------------------


def test_a_reply_larger_than_max_reply_bytes_is_refused(server):
    assert MAX_REPLY_BYTES == 4 * 1024 * 1024
    server.reply(text="a" * 5000)
    with pytest.raises(ModelError, match="max_reply_bytes=1000") as info:
        model(server.url, max_reply_bytes=1000).complete(Q)
    assert info.value.kind == "too_large"
    server.reply(text="b" * 300_000)  # the body itself is over the wire cap: refused before it is all read
    with pytest.raises(ModelError, match="max_reply_bytes") as info:
        model(server.url, max_reply_bytes=1000).complete(Q)
    assert info.value.kind == "too_large"


def test_a_streamed_reply_is_capped_as_it_arrives(server):
    server.reply(text="c" * 5000, text_piece=100)
    tokens: list[str] = []
    with pytest.raises(ModelError) as info:
        model(server.url, max_reply_bytes=1000).complete(Q, on_token=tokens.append)
    assert info.value.kind == "too_large" and len(info.value.partial.text) <= 1100 and len(tokens) <= 11


def test_tool_call_arguments_count_toward_the_cap(server):
    server.reply(text=None, tool_calls=[("c", "f", json.dumps({"blob": "d" * 3000}))])
    with pytest.raises(ModelError, match="too_large|max_reply_bytes"):
        model(server.url, max_reply_bytes=1000).complete(Q)


# --- credentials never shown ---------------------------------------------------------------------


def test_url_credentials_and_keys_are_redacted_everywhere(server):
    echo = {"error": "denied for Basic ZGFuYTpzM2NyZXQtcGFzcw== user dana pass s3cret-pass key sk-live-123"}
    server.respond(401, echo)
    url = server.url.replace("http://", "http://dana:s3cret-pass@")
    chat = model(url, api_key="sk-live-123")
    with pytest.raises(ModelError) as info:
        chat.complete(Q)
    shown = [str(info.value), info.value.url, repr(chat), chat.base_url, chat.url]
    for text in shown:
        assert "s3cret-pass" not in text and "sk-live-123" not in text and "ZGFuYTpzM2NyZXQtcGFzcw" not in text, text
    assert "***@127.0.0.1" in chat.base_url and "***" in str(info.value)


def test_basic_auth_from_the_url_when_there_is_no_api_key(server):
    server.reply(text="ok")
    model(server.url.replace("http://", "http://dana:s3cret@")).complete(Q)
    assert server.requests[0]["headers"]["Authorization"] == "Basic ZGFuYTpzM2NyZXQ="


def test_connection_errors_redact_credentials_too():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    chat = model(f"http://dana:hunter22@127.0.0.1:{port}/v1", max_retries=0)
    with pytest.raises(ModelError) as info:
        chat.complete(Q)
    assert info.value.kind == "connection" and "hunter22" not in str(info.value) and "***@" in str(info.value)


@pytest.mark.parametrize("url", ["ftp://host/v1", "not a url", "http://dana:pw@host:port/v1", "http:///v1"])
def test_bad_base_urls_are_refused_without_echoing_credentials(url):
    with pytest.raises(ModelConfigError) as info:
        OpenAICompatibleModel(url, "m1")
    assert "base_url" in str(info.value) and "dana" not in str(info.value) and ":pw@" not in str(info.value)


def test_errors_belong_to_the_tracemem_tree():
    assert issubclass(ModelError, TracememError)
    with pytest.raises(ValueError, match="timeout must be > 0"):
        OpenAICompatibleModel("http://127.0.0.1:9/v1", "m", timeout=0)
    with pytest.raises(ModelConfigError, match="max_reply_bytes"):
        OpenAICompatibleModel("http://127.0.0.1:9/v1", "m", max_reply_bytes=0)


# --- proxies -------------------------------------------------------------------------------------


def test_a_remote_host_goes_through_the_environment_proxy(server, monkeypatch):
    monkeypatch.setenv("http_proxy", server.origin)
    monkeypatch.setenv("no_proxy", "")
    server.reply(text="via proxy")
    assert model("http://api.example.invalid/v1", api_key="k").complete(Q).text == "via proxy"
    assert server.requests[0]["path"] == "http://api.example.invalid/v1/chat/completions"
