"""Streaming over server-sent events, against a real local OpenAI-compatible server."""
from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from openai_server import Completion, OpenAIServer
from tracemem.models import (ModelError, OpenAICompatibleModel, Reply, TextDelta, ToolCall, ToolCallDelta, Usage,
                             astream_reply)

Q = [{"role": "user", "content": "hello"}]
USAGE = {"prompt_tokens": 11, "completion_tokens": 7}
TWO_CALLS = [("call_1", "add", '{"a": 2, "b": 3}'), ("call_2", "lookup", '{"city": "Oslo", "days": 3}')]


@pytest.fixture
def server():
    with OpenAIServer() as s:
        yield s


def model(server: OpenAIServer, **kw: Any) -> OpenAICompatibleModel:
    return OpenAICompatibleModel(server.url, "m1", backoff=0.01, **kw)


def test_text_deltas_reach_on_token_in_order(server):
    server.reply(text="The quick brown fox.", usage=USAGE, text_piece=3)
    tokens: list[str] = []
    reply = model(server).complete(Q, on_token=tokens.append)
    assert tokens == ["The", " qu", "ick", " br", "own", " fo", "x."]
    assert reply == Reply(text="The quick brown fox.", usage=Usage(11, 7), model="m1", finish_reason="stop")
    body = server.requests[0]["body"]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert server.requests[0]["headers"]["Accept"] == "text/event-stream"


def test_stream_yields_typed_events_then_the_reply(server):
    server.reply(text="Let me check.", tool_calls=TWO_CALLS, text_piece=20, args_piece=8)
    events = list(model(server).stream(Q, tools=[{"name": "add"}, {"name": "lookup"}]))
    assert events[0] == TextDelta("Let me check.")
    deltas = [e for e in events if isinstance(e, ToolCallDelta)]
    assert deltas[0] == ToolCallDelta(0, "call_1", "add", "")
    assert "".join(d.arguments for d in deltas if d.index == 1) == TWO_CALLS[1][2]
    reply = events[-1]
    assert isinstance(reply, Reply) and events.count(reply) == 1
    assert reply.text == "Let me check." and reply.finish_reason == "tool_calls"


def test_interleaved_tool_call_deltas_are_assembled_by_index(server):
    server.reply(text=None, tool_calls=TWO_CALLS, interleave=True, args_piece=3)
    reply = model(server).complete(Q, on_token=lambda t: None)
    assert reply.tool_calls == (ToolCall(id="call_1", name="add", arguments_text=TWO_CALLS[0][2]),
                                ToolCall(id="call_2", name="lookup", arguments_text=TWO_CALLS[1][2]))
    assert reply.tool_calls[1].arguments == {"city": "Oslo", "days": 3} and reply.text == ""


@pytest.mark.parametrize("completion", [
    Completion(text="plain text", usage=USAGE),
    Completion(text=None, tool_calls=TWO_CALLS, usage=USAGE, interleave=True),
    Completion(text="both", tool_calls=TWO_CALLS[:1], usage=USAGE, chunked=False),
    Completion(text="", usage=USAGE),
    Completion(text="no usage from this server"),
    Completion(text="cut short", finish_reason="length", usage={"prompt_tokens": "??", "completion_tokens": 10**12}),
], ids=["text", "tools", "both-unchunked", "empty", "no-usage", "length-bad-usage"])
def test_a_streamed_reply_equals_the_same_reply_received_whole(server, completion):
    server.reply(completion)
    whole = model(server).complete(Q)
    streamed = model(server).complete(Q, on_token=lambda t: None)
    via_flag = model(server, stream=True).complete(Q)
    assert streamed == whole == via_flag
    assert (whole.text, whole.usage, whole.model, whole.finish_reason) == (
        streamed.text, streamed.usage, streamed.model, streamed.finish_reason)
    assert streamed.raw["choices"][0]["message"]["tool_calls" if completion.tool_calls else "role"]


def test_tokens_arrive_while_the_server_is_still_sending(server):
    server.reply(text="abcdefgh", text_piece=2, event_delay=0.15)
    seen: list[float] = []
    model(server).complete(Q, on_token=lambda t: seen.append(time.monotonic()))
    finished = time.monotonic()
    assert len(seen) == 4 and finished - seen[0] > 0.3  # the first token came long before the end


def test_a_cut_off_stream_raises_with_the_partial_reply(server):
    server.reply(text="Hello there, friend", text_piece=6, cut_after=3)  # role chunk + 2 text chunks
    tokens: list[str] = []
    with pytest.raises(ModelError) as info:
        model(server).complete(Q, on_token=tokens.append)
    err = info.value
    assert err.kind == "cut_off" and "partial reply" in str(err) and "'m1'" in str(err)
    assert err.partial is not None and err.partial.text == "Hello there," == "".join(tokens)
    assert len(server.requests) == 1  # a broken stream is not retried: its tokens were already delivered


def test_a_stream_cut_inside_a_tool_call_keeps_the_calls_so_far(server):
    server.reply(text=None, tool_calls=TWO_CALLS, args_piece=4, cut_after=9, cut_mid_event=True, chunked=False)
    with pytest.raises(ModelError) as info:
        list(model(server).stream(Q))
    partial = info.value.partial
    assert info.value.kind == "cut_off" and partial is not None
    assert [c.name for c in partial.tool_calls] == ["add", "lookup"]
    assert partial.tool_calls[0].arguments == {"a": 2, "b": 3} and partial.tool_calls[1].arguments is None
    assert TWO_CALLS[1][2].startswith(partial.tool_calls[1].arguments_text)


def test_a_stream_without_done_but_with_a_finish_reason_is_complete(server):
    server.reply(text="fine", done=False, chunked=False, usage=USAGE)
    assert model(server).complete(Q, on_token=lambda t: None) == Reply(text="fine", usage=Usage(11, 7), model="m1",
                                                                       finish_reason="stop")


def test_a_server_that_ignores_stream_true_still_works(server):
    server.respond(body=Completion(text="whole anyway", usage=USAGE).body(), headers={"Content-Type": "application/json"})
    tokens: list[str] = []
    reply = model(server).complete(Q, on_token=tokens.append)
    assert reply.text == "whole anyway" and tokens == ["whole anyway"]


def test_an_error_event_mid_stream(server):
    events = b'data: {"choices": [{"index": 0, "delta": {"content": "par"}}]}\n\ndata: {"error": {"message": "overloaded"}}\n\n'
    server.respond(body=events, headers={"Content-Type": "text/event-stream"})
    with pytest.raises(ModelError) as info:
        model(server).complete(Q, on_token=lambda t: None)
    assert info.value.kind == "status" and "overloaded" in str(info.value) and info.value.partial.text == "par"


def test_a_stream_event_that_is_not_json(server):
    server.respond(body=b"data: {not json\n\n", headers={"Content-Type": "text/event-stream"})
    with pytest.raises(ModelError, match="not JSON") as info:
        list(model(server).stream(Q))
    assert info.value.kind == "bad_reply"


def test_a_slow_stream_times_out_as_a_whole_with_the_partial(server):
    server.reply(text="x" * 40, text_piece=1, event_delay=0.1)
    start = time.monotonic()
    with pytest.raises(ModelError) as info:
        model(server, timeout=0.6).complete(Q, on_token=lambda t: None)
    assert info.value.kind == "timeout" and 0 < len(info.value.partial.text) < 40
    assert time.monotonic() - start < 3


def test_closing_the_stream_early_closes_the_connection(server):
    server.reply(text="y" * 50, text_piece=1, event_delay=0.2)
    stream = model(server, timeout=30).stream(Q)
    assert next(stream) == TextDelta("y")
    start = time.monotonic()
    stream.close()
    assert time.monotonic() - start < 3  # the server would trickle for 10 s more


def test_astream_and_acomplete_with_on_token(server):
    server.reply(text="async words here", text_piece=6, usage=USAGE)
    chat = model(server)

    async def go() -> tuple[list[Any], Reply, list[str]]:
        events = [e async for e in chat.astream(Q)]
        tokens: list[str] = []
        reply = await chat.acomplete(Q, on_token=tokens.append)
        return events, reply, tokens

    events, reply, tokens = asyncio.run(go())
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "async words here"
    assert events[-1] == reply and tokens == ["async ", "words ", "here"]


def test_breaking_out_of_astream_stops_the_worker(server):
    server.reply(text="z" * 50, text_piece=1, event_delay=0.2)

    async def go() -> float:
        stream = astream_reply(model(server, timeout=30), Q)
        async for event in stream:
            assert event == TextDelta("z")
            break
        start = time.monotonic()
        await stream.aclose()
        return time.monotonic() - start

    assert asyncio.run(go()) < 1.5
