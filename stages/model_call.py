"""`call_model`: one chat-model call, recorded against the prompt it saw.

The model comes from `ctx.env` (untracked; `flow.run(..., env={"model": m})`) or
is passed in. A `model_calls` row keeps model, provider, prompt id, response,
tokens and latency; a model error fails the step with the error recorded (and the
row), while every earlier step of the run stays recorded.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Union

from tracemem import StageContext, TracememError
from tracemem.models import ChatModel


def call_model(model: Union[ChatModel, str] = "model", *, system_from: Optional[str] = "prompt",
               prompt_id_from: Optional[str] = "prompt_id", messages_from: Optional[str] = "messages",
               question_from: Optional[str] = "question", into: str = "answer", append_to_messages: bool = True,
               schema: Any = None) -> Callable[[Any, StageContext], None]:
    """A stage sending system prompt + conversation (+ the question) and writing the reply to `scope.<into>`."""

    def respond(scope: Any, ctx: StageContext) -> None:
        chat = model
        if isinstance(model, str):
            if model not in ctx.env:
                raise TracememError(f"call_model needs a model in env['{model}']: flow.run(..., env={{'{model}': m}})")
            chat = ctx.env[model]
        messages: list[dict[str, str]] = []
        if system_from and getattr(scope, system_from):
            messages.append({"role": "system", "content": getattr(scope, system_from)})
        history = list(getattr(scope, messages_from)) if messages_from else []
        messages += [dict(m) for m in history]
        question = getattr(scope, question_from) if question_from else ""
        asked = bool(question) and not (history and history[-1].get("role") == "user"
                                        and history[-1].get("content") == question)
        if asked:
            messages.append({"role": "user", "content": question})
        prompt_id = getattr(scope, prompt_id_from) if prompt_id_from else None
        reply = ctx.complete(chat, messages, prompt_id=prompt_id, schema=schema)
        setattr(scope, into, reply.text)
        if append_to_messages and messages_from:
            target = getattr(scope, messages_from)
            if asked:
                target.append({"role": "user", "content": question})
            target.append({"role": "assistant", "content": reply.text})

    respond.__name__ = respond.__qualname__ = "call_model"
    return respond
