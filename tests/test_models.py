"""Tests for tracemem.models: a real local HTTP server for the OpenAI adapter, plus ScriptedModel."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from typing import Any

import pytest
from pydantic import BaseModel

from openai_server import Completion, OpenAIServer
from tracemem.models import (
    RETRY_AFTER_CAP,
    ChatModel,
    ModelError,
    OpenAICompatibleModel,
    Reply,
    ScriptedModel,
    Usage,
    count_tokens_estimate,
)

MSGS = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]


def ok_body(text: str = "hi!", usage: dict | None = None, model: str = "m1") -> dict:
    return Completion(text=text, usage=usage, model=model).body()


@pytest.fixture
def server():
    with OpenAIServer() as fake:
        yield fake


def model(server: OpenAIServer, **kw: Any) -> OpenAICompatibleModel:
    kw.setdefault("backoff", 0.01)
    return OpenAICompatibleModel(server.url, kw.pop("model", "m1"), **kw)


# --- OpenAICompatibleModel ---------------------------------------------------------------


def test_success_sends_model_messages_and_auth(server):
    server.respond(body=ok_body("hi!", usage={"prompt_tokens": 7, "completion_tokens": 2}, model="m1-2024"))
    reply = model(server, api_key="sk-test", extra_body={"temperature": 0}).complete(MSGS)
    assert reply == Reply(text="hi!", usage=Usage(7, 2), model="m1-2024", finish_reason="stop")
    assert reply.raw["choices"][0]["message"]["content"] == "hi!"
    (req,) = server.requests
    assert req["path"] == "/v1/chat/completions"
    assert req["body"] == {"model": "m1", "messages": MSGS, "temperature": 0}
    assert req["headers"]["Authorization"] == "Bearer sk-test"
    assert req["headers"]["Content-Type"] == "application/json"
    assert "response_format" not in req["body"]


def test_no_auth_header_without_key_and_missing_usage_is_unknown(server):
    server.respond(body=ok_body("x"))
    reply = model(server).complete(MSGS)
    assert reply.usage == Usage(None, None)  # the server did not say: unknown, not zero
    assert reply.model == "m1"
    assert "Authorization" not in server.requests[0]["headers"]


def test_trailing_slash_in_base_url(server):
    server.respond()
    OpenAICompatibleModel(server.url + "/", "m1").complete(MSGS)
    assert server.requests[0]["path"] == "/v1/chat/completions"


def test_429_then_success_honours_retry_after(server):
    server.respond(429, {"error": "slow down"}, headers={"Retry-After": "0"})
    server.respond(body=ok_body("after retry"))
    start = time.monotonic()
    reply = model(server, backoff=5.0).complete(MSGS)  # Retry-After: 0 overrides the 5 s backoff
    assert time.monotonic() - start < 3.0
    assert reply.text == "after retry"
    assert len(server.requests) == 2


def test_persistent_500_gives_up_after_max_retries(server):
    server.respond(500, b"upstream exploded")
    with pytest.raises(ModelError) as info:
        model(server, max_retries=3).complete(MSGS)
    err = info.value
    assert err.kind == "status" and err.status == 500 and err.attempts == 4
    assert len(server.requests) == 4
    msg = str(err)
    assert "500" in msg and "upstream exploded" in msg and "/v1/chat/completions" in msg
    assert "'m1'" in msg and "4 attempts" in msg and "server logs" in msg


def test_400_is_not_retried(server):
    server.respond(400, {"error": {"message": "unknown model"}})
    with pytest.raises(ModelError) as info:
        model(server, max_retries=3).complete(MSGS)
    assert info.value.kind == "status" and info.value.status == 400
    assert "unknown model" in str(info.value)
    assert len(server.requests) == 1


def test_401_hint_mentions_api_key(server):
    server.respond(401, {"error": "bad key"})
    with pytest.raises(ModelError, match="api_key"):
        model(server, api_key="wrong").complete(MSGS)
    assert len(server.requests) == 1


def test_timeout(server):
    server.respond(delay=3.0)
    start = time.monotonic()
    with pytest.raises(ModelError) as info:
        model(server, timeout=0.2).complete(MSGS)
    assert info.value.kind == "timeout"
    assert "timeout=0.2" in str(info.value)
    assert time.monotonic() - start < 2.0  # gave up well before the reply (margin for a loaded machine)
    assert len(server.requests) == 1  # timeouts are not retried


@pytest.mark.parametrize(
    "body, fragment",
    [
        (b"<html>Bad Gateway</html>", "is not JSON"),
        ({"choices": []}, "lacks choices[0].message"),
        ({"object": "list", "data": []}, "lacks choices[0].message"),
        ({"choices": [{"message": {"content": None}}]}, "no text content and no tool calls"),
        ({"choices": [{"message": {"content": None, "tool_calls": [{"id": "x", "function": 3}]}}]}, "malformed tool call"),
        ({"choices": [{"message": {"content": None, "refusal": "no"}}]}, "refusal"),
    ],
)
def test_bad_reply(server, body, fragment):
    server.respond(body=body)
    with pytest.raises(ModelError) as info:
        model(server).complete(MSGS)
    assert info.value.kind == "bad_reply"
    assert fragment in str(info.value)
    assert len(server.requests) == 1


def test_connection_error_is_retried_then_reported():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    m = OpenAICompatibleModel(f"http://127.0.0.1:{port}/v1", "m1", max_retries=1, backoff=0.01)
    with pytest.raises(ModelError) as info:
        m.complete(MSGS)
    assert info.value.kind == "connection" and info.value.attempts == 2
    assert f"127.0.0.1:{port}" in str(info.value) and "running" in str(info.value)


class Answer(BaseModel):
    answer: str
    confidence: float


def test_schema_from_pydantic_model(server):
    server.respond(body=ok_body('{"answer": "Paris", "confidence": 0.9}'))
    reply = model(server).complete(MSGS, schema=Answer)
    assert Answer.model_validate_json(reply.text).answer == "Paris"
    rf = server.requests[0]["body"]["response_format"]
    assert rf == {
        "type": "json_schema",
        "json_schema": {"name": "Answer", "schema": Answer.model_json_schema(), "strict": True},
    }


def test_schema_from_dict(server):
    schema = {"title": "city pick", "type": "object", "properties": {"city": {"type": "string"}}}
    server.respond(body=ok_body('{"city": "Oslo"}'))
    reply = model(server).complete(MSGS, schema=schema)
    assert reply.text == '{"city": "Oslo"}'
    js = server.requests[0]["body"]["response_format"]["json_schema"]
    assert js == {"name": "city_pick", "schema": schema, "strict": True}


def test_acomplete_runs_in_thread(server):
    server.respond(body=ok_body("async hi"))
    reply = asyncio.run(model(server).acomplete(MSGS))
    assert reply.text == "async hi"


def test_retry_delay_honours_numeric_retry_after_capped():
    m = OpenAICompatibleModel("http://127.0.0.1:9/v1", "m", backoff=0.5)
    assert m._delay(0, "2") == 2.0
    assert m._delay(0, "99999") == RETRY_AFTER_CAP
    assert m._delay(2, None) == 2.0  # 0.5 * 2**2
    assert m._delay(1, "Wed, 21 Oct 2015 07:28:00 GMT") == 1.0  # non-numeric: own backoff


def test_construction_is_offline_and_repr_hides_key():
    m = OpenAICompatibleModel("http://does-not-exist.invalid/v1", "gpt-x", api_key="sk-secret")
    assert isinstance(m, ChatModel)
    assert (m.name, m.provider) == ("gpt-x", "openai")
    assert "sk-secret" not in repr(m)


# --- ScriptedModel -----------------------------------------------------------------------


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": "sys prompt"}, {"role": "user", "content": text}]


def test_scripted_replies_in_order_and_exhaustion():
    m = ScriptedModel(["one", "two"])
    assert isinstance(m, ChatModel)
    assert m.complete(user("a")).text == "one"
    assert m.complete(user("b")).text == "two"
    with pytest.raises(ModelError) as info:
        m.complete(user("c"))
    assert info.value.kind == "script"
    assert "2 were scripted" in str(info.value) and "call 3" in str(info.value)
    assert [c[-1]["content"] for c in m.calls] == ["a", "b", "c"]


def test_scripted_rules_substring_regex_callable():
    m = ScriptedModel(
        rules=[
            ("capital of France", "Paris"),
            (re.compile(r"\b\d+ \+ \d+\b"), lambda msgs: str(eval(re.search(r"\d+ \+ \d+", msgs[-1]["content"])[0]))),
            (lambda msgs: len(msgs) > 2, "long conversation"),
        ]
    )
    assert m.complete(user("What is the capital of France?")).text == "Paris"
    assert m.complete(user("compute 2 + 3 please")).text == "5"
    assert m.complete(user("x") + [{"role": "assistant", "content": "y"}]).text == "long conversation"
    with pytest.raises(ModelError, match="no rule matching") as info:
        m.complete(user("unmatched"))
    assert info.value.kind == "script"


def test_scripted_rules_match_last_user_message_only():
    m = ScriptedModel(rules=[("secret", "found")], default="nope")
    msgs = [{"role": "user", "content": "secret"}, {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "something else"}]
    assert m.complete(msgs).text == "nope"
    assert m.complete([{"role": "system", "content": "secret"}, {"role": "user", "content": "hi"}]).text == "nope"


def test_scripted_default_and_precedence():
    m = ScriptedModel(["listed"], rules=[("rule", "ruled")], default=lambda msgs: f"echo {msgs[-1]['content']}")
    assert m.complete(user("rule me")).text == "ruled"  # rules win
    assert m.complete(user("a")).text == "listed"  # then the list
    assert m.complete(user("b")).text == "echo b"  # then default


def test_scripted_usage_and_structured_reply():
    m = ScriptedModel([Answer(answer="Paris", confidence=1.0), {"k": 1}], name="demo-model")
    reply = m.complete(user("one two three"))
    assert reply.usage == Usage(input_tokens=2 + 3, output_tokens=count_tokens_estimate(reply.text))
    assert reply.model == "demo-model" and reply.raw is None
    assert Answer.model_validate_json(reply.text).answer == "Paris"
    assert json.loads(m.complete(user("x"), schema={"type": "object"}).text) == {"k": 1}


def test_scripted_calls_are_snapshots():
    m = ScriptedModel(default="ok")
    msgs = user("before")
    m.complete(msgs)
    msgs[-1]["content"] = "after"
    assert m.calls[0][-1]["content"] == "before"


def test_scripted_acomplete():
    m = ScriptedModel(["a", "b"], provider="scripted")

    async def both() -> list[Reply]:
        return [await m.acomplete(user("1")), await m.acomplete(user("2"))]

    assert [r.text for r in asyncio.run(both())] == ["a", "b"]


def test_scripted_thread_safe_cursor():
    n = 200
    m = ScriptedModel([str(i) for i in range(n)])
    out: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(n // 8):
            text = m.complete(user("go")).text
            with lock:
                out.append(text)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(out, key=int) == [str(i) for i in range(n)]
    assert len(m.calls) == n


def test_count_tokens_estimate():
    assert count_tokens_estimate("") == 0
    assert count_tokens_estimate("  two\nwords ") == 2
