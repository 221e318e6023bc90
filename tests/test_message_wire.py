"""`Message.wire()` / `ToolCall.wire()`: the wire shape built directly, identical to `model_dump()`, and the
request hash of recorded model calls unchanged by it (replay matches calls recorded before)."""
from __future__ import annotations

import hashlib
import json

from pydantic import BaseModel

from tracemem.flow.replay import request_hash
from tracemem.models import Message, ToolCall

MESSAGES = [
    Message(role="system", content="be brief"),
    Message(role="user", content="weather in Oslo? ünïcode ✓"),
    Message(role="assistant", tool_calls=[ToolCall(id="c1", name="lookup", arguments={"city": "Oslo", "days": 3}),
                                          ToolCall(id="c2", name="lookup", arguments_text="{not json")]),
    Message(role="tool", tool_call_id="c1", name="lookup", content='{"temp": 3}'),
]


def test_wire_is_what_model_dump_gives_in_both_modes():
    for m in MESSAGES:
        assert m.wire() == m.model_dump() == m.model_dump(mode="json")
        assert json.loads(m.model_dump_json()) == m.wire()
    call = MESSAGES[2].tool_calls[1]
    assert call.wire() == call.model_dump() == {"id": "c2", "type": "function",
                                                "function": {"name": "lookup", "arguments": "{not json"}}


def test_the_request_hash_is_the_one_recorded_before():
    """The formula calls recorded by earlier versions were hashed with (each message's model_dump in JSON
    mode): a replay must still find them."""
    mixed = [*MESSAGES, {"role": "user", "content": "a dict message, hashed as given"}]
    options = {"temperature": 0, "tools": None}

    def before(model: str, messages: list, opts: dict) -> str:
        dumped = [m.model_dump(mode="json") if isinstance(m, BaseModel) else m for m in messages]
        body = {"model": model, "messages": dumped, "options": opts}
        text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    assert request_hash("m1", mixed, options) == before("m1", mixed, options)


def test_with_id_is_a_copy_with_the_id_set():
    call = ToolCall(name="lookup", arguments={"city": "Oslo"})
    named = call.with_id("call_7_0")
    assert named.id == "call_7_0" and call.id == "" and named.arguments == call.arguments
    assert named == call.model_copy(update={"id": "call_7_0"})
