"""`call_model`: one chat-model call, recorded against the prompt it saw.

The model comes from `ctx.env` (untracked; `flow.run(..., env={"model": m})`) or
is passed in. A `model_calls` row keeps model, provider, prompt id, response, the
tool calls asked for, tokens and latency; a model error fails the step with the
error recorded (and the row), while every earlier step of the run stays recorded.
The conversation is typed (`tracemem.models.Message`): the reply is appended as the
assistant message it was, tool calls included. `conversation` and `chat_model` are
shared with the tool agent (`stages/tool_agent.py`).
"""
from __future__ import annotations

import copy
from typing import Any, Callable, Optional, Sequence, Union

from tracemem import ScopeWriteError, StageContext, TracememError
from tracemem.models import ChatModel, Message, ToolChoice

__all__ = ["call_model", "chat_model", "conversation", "append_message"]


def chat_model(model: Union[ChatModel, str], ctx: StageContext, stage: str) -> Any:
    """The model itself, or the one `ctx.env[model]` holds (an error naming the stage when it is missing)."""
    if not isinstance(model, str):
        return model
    if model not in ctx.env:
        raise TracememError(f"{stage} needs a model in env['{model}']: flow.run(..., env={{'{model}': m}})")
    return ctx.env[model]


def conversation(scope: Any, *, system_from: Optional[str], messages_from: Optional[str],
                 question_from: Optional[str], ask: bool = True) -> tuple[list[Any], bool]:
    """What to send (through `ctx.complete`, which sends the scope's copies as plain messages): the
    system prompt, the history (Messages, or the dicts of an older scope), and the question unless the
    history already ends with it or `ask` is False; and whether the question was added."""
    messages: list[Any] = []
    if system_from and getattr(scope, system_from):
        messages.append(Message(role="system", content=getattr(scope, system_from)))
    # `copy.copy` of the scope's tracked list gives the stored messages without making each a tracked copy
    # (a few µs per message per call); each goes out as a shallow copy, as a tracked copy would have
    history = [copy.copy(m) for m in copy.copy(getattr(scope, messages_from))] if messages_from else []
    messages += history
    question = getattr(scope, question_from) if question_from else ""
    asked = ask and bool(question) and not (history and history[-1].get("role") == "user"
                                            and history[-1].get("content") == question)
    if asked:
        messages.append(Message(role="user", content=question))
    return messages, asked


def append_message(target: Any, message: Message) -> None:
    """Append to a scope's message list: the Message, or, for a scope that keeps plain
    `{"role", "content"}` dicts (`list[dict[str, str]]`), that dict."""
    try:
        target.append(message)
    except ScopeWriteError:
        target.append({"role": message.role, "content": message.content or ""})


def call_model(model: Union[ChatModel, str] = "model", *, system_from: Optional[str] = "prompt",
               prompt_id_from: Optional[str] = "prompt_id", messages_from: Optional[str] = "messages",
               question_from: Optional[str] = "question", into: str = "answer", append_to_messages: bool = True,
               schema: Any = None, tools: Optional[Sequence[Any]] = None,
               tool_choice: ToolChoice = None) -> Callable[[Any, StageContext], None]:
    """A stage sending system prompt + conversation (+ the question) and writing the reply to `scope.<into>`.

    `tools` (Tool objects, a ToolSet, ToolSpecs or OpenAI dicts) and `tool_choice` go to the model;
    the assistant message appended then carries the tool calls it asked for. To run them, use
    `tool_agent` (a recorded think → tools → think loop)."""
    options: dict[str, Any] = {"schema": schema}
    if tools is not None:
        options["tools"] = list(tools)
    if tool_choice is not None:
        options["tool_choice"] = tool_choice

    def respond(scope: Any, ctx: StageContext) -> None:
        chat = chat_model(model, ctx, "call_model")
        messages, asked = conversation(scope, system_from=system_from, messages_from=messages_from,
                                       question_from=question_from)
        prompt_id = getattr(scope, prompt_id_from) if prompt_id_from else None
        reply = ctx.complete(chat, messages, prompt_id=prompt_id, **options)
        setattr(scope, into, reply.text)
        if append_to_messages and messages_from:
            target = getattr(scope, messages_from)
            if asked:
                append_message(target, Message(role="user", content=messages[-1].content))
            append_message(target, reply.message)

    respond.__name__ = respond.__qualname__ = "call_model"
    return respond
