"""`ctx.complete`: a chat model call recorded as a `model_calls` row of its step, with its exact request.

The row holds the model, provider, prompt id, reply, the tool calls it asked for, tokens,
latency and the error if it failed (a stream cut off mid-reply records what arrived),
and the hash of the exact request (model name, messages, every option) so the call can be
replayed: when the run replays a record (a `replay=True` fork, a resumed stage's calls
before its pause), a request found there is answered from it and the row says `replayed`.
The request itself is stored content-addressed (tracemem/exchange.py), secrets masked.
"""
from __future__ import annotations

import inspect
import time
from typing import TYPE_CHECKING, Any, Callable, Optional

from ..exchange import Exchange, exchange_of, output_row
from ..ids import new_id
from ..masking import credentials, run_masker
from ..models import ModelConfigError
from ..models.messages import wire_message
from ..scope.recorder import StepRecorder
from ..scope.tracked import unwrap
from .replay import ReplayModel, request_hash

if TYPE_CHECKING:
    from .events import EventFeed

__all__ = ["ModelCallRecorder", "reply_columns"]


class ModelCallRecorder:
    """Records the model calls of one step (see the module docstring)."""

    def __init__(self, rec: StepRecorder, run_id: str, store: Any, replay: Any, events: Optional["EventFeed"]) -> None:
        self.rec, self.run_id, self.store, self.replay, self.events = rec, run_id, store, replay, events

    def complete(self, model: Any, messages: list[Any], prompt_id: Optional[str], options: dict[str, Any]) -> Any:
        """Call `model.complete(messages, **options)` (or answer it from the replayed record) and record it."""
        rec, events = self.rec, self.events
        rec.state.secrets.update(credentials(model))  # masked in everything the step records
        name = getattr(model, "name", None)
        messages = [unwrap(m) for m in messages]  # a scope's tracked copies go out (and are hashed) as plain messages
        h = request_hash(name, messages, options)
        call = {"run_id": self.run_id, "step": rec.step, "call_id": new_id(48), "model": name,
                "provider": getattr(model, "provider", None), "prompt_id": prompt_id or None, "request_hash": h}
        exchange = self._exchange(messages, options)
        call.update(exchange.columns)
        if events is not None and _takes_on_token(model):
            options["on_token"] = events.token_callback(self.run_id, rec.step, rec.stage, options.get("on_token"))
        started = time.time_ns()
        try:
            if self.replay is not None:
                reply = ReplayModel(self.replay, live=model, name=name).answer(h, messages, options)
            elif isinstance(model, ReplayModel):
                reply = model.answer(h, messages, options)
            else:
                reply = model.complete(messages, **options)
        except Exception as err:
            partial = getattr(err, "partial", None)  # ModelError: a stream broke; keep what arrived
            self._add_exchange(exchange, call["call_id"], partial)
            columns = reply_columns(partial, name) if partial is not None else {
                "response": None, "input_tokens": None, "output_tokens": None, "tool_calls": None}
            rec.add_row("model_calls", {**call, **columns, "latency_ms": (time.time_ns() - started) / 1e6,
                                        "started_at": started, "error": f"{type(err).__name__}: {err}",
                                        "replayed": False, "output_id": self._output_id(partial)})
            raise
        self._add_exchange(exchange, call["call_id"], reply)
        rec.add_row("model_calls", {**call, **reply_columns(reply, name), "latency_ms": (time.time_ns() - started) / 1e6,
                                    "started_at": started, "error": None,
                                    "replayed": bool(getattr(reply, "replayed", False)),
                                    "output_id": self._output_id(reply)})
        if events is not None and getattr(reply, "tool_calls", None):
            events.tool_requested(self.run_id, rec.step, rec.stage, reply.tool_calls)
        return reply

    def _exchange(self, messages: list[Any], options: dict[str, Any]) -> Exchange:
        """The call's exact request as content-addressed rows (tracemem/exchange.py), secrets masked first."""
        wire = []
        for i, message in enumerate(messages):
            try:
                wire.append(wire_message(message, i))
            except ModelConfigError:  # the model says what is wrong with it; the record keeps what was given
                wire.append({"role": None, "content": repr(message)})
        return exchange_of(wire, options, self.run_id, getattr(self.store, "known_content", None), self._masking())

    def _masking(self) -> Callable[[Any], Any]:
        """What masks the run's known secrets in a value (as the runner masks what a step records)."""
        rec = self.rec
        masker = run_masker(rec.state.schema.secret, rec.state.data, rec.state.secrets, rec.overlay)
        return masker.value if masker else _same

    def _add_exchange(self, exchange: Exchange, call_id: str, reply: Any) -> None:
        """The content rows the call adds, and the whole request for telemetry (`_exchange`, never stored)."""
        for table, row in exchange.rows:
            self.rec.add_row(table, row)
        self.rec.add_row("_exchange", {"call_id": call_id, "system": exchange.system, "messages": exchange.messages,
                                       "tools": exchange.tools, "options": exchange.options})

    def _output_id(self, reply: Any) -> Optional[str]:
        """The reply's message id (its `messages` row added when new); None without a reply."""
        message = getattr(reply, "message", None) if reply is not None else None
        output_id, rows = output_row(message.wire() if message is not None else None, self.run_id,
                                     getattr(self.store, "known_content", None), self._masking())
        for table, row in rows:
            self.rec.add_row(table, row)
        return output_id


def _same(value: Any) -> Any:
    return value


def reply_columns(reply: Any, model: Optional[str]) -> dict[str, Any]:
    """The `model_calls` columns a reply fills: model, response, tokens, and the tool calls asked for
    (`[{"id", "name", "arguments"}]`, arguments as the raw text the model sent; None when there were none)."""
    usage = getattr(reply, "usage", None)
    calls = getattr(reply, "tool_calls", None)
    return {"model": getattr(reply, "model", None) or model, "response": reply.text,
            "input_tokens": getattr(usage, "input_tokens", None),
            "output_tokens": getattr(usage, "output_tokens", None),
            "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments_text} for c in calls] if calls
            else None}


def _takes_on_token(model: Any) -> bool:
    """Whether `model.complete` accepts `on_token` (the ChatModel protocol does; an older adapter may not)."""
    try:
        params = inspect.signature(model.complete).parameters
    except (TypeError, ValueError):
        return False
    return "on_token" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
