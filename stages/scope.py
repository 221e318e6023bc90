"""`AgentScope`: the fields the ready-made stages read and write by default.

Subclass it to add your own fields; every stage also takes the field names as
parameters, so any scope with fields of these shapes works. The conversation is
typed (`tracemem.models.Message`); runs stored when it held plain
`{"role", "content"}` dicts load back as Messages.
"""
from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel

from tracemem import PerTurn
from tracemem.models import Message, ToolCall


class AgentScope(BaseModel):
    question: str = ""  # this turn's user message
    turn_id: str = ""  # the host's id for this turn (kept as memory provenance)
    messages: list[Message] = []  # the conversation so far (assistant tool calls and tool results included)
    user: dict[str, str] = {}  # identity facts the host vouches for (server-trust)
    context: dict[str, Any] = {}  # other data the prompt should carry
    memories: list[dict[str, Any]] = []  # what recall injected
    recall_receipt: dict[str, Any] = {}  # how recall ran and what it left out
    snapshot: str = ""  # past-run context from load_snapshot
    prompt: str = ""  # the assembled system prompt
    prompt_id: str = ""
    # the tool calls the model's latest reply asked for (tool_agent); a thread's next turn starts without them
    pending_tool_calls: Annotated[list[ToolCall], PerTurn] = []
    answer: str = ""
