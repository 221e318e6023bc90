"""The optional second parameter of a stage: run facts, untracked dependencies, recorded model calls.

A stage that takes `ctx` can log lines kept with its step, leave a loop, call a
chat model so that the call is recorded (`ctx.complete`), mark the run degraded
while it still succeeds (`ctx.degrade`), pause the run for a human (`ctx.interrupt`,
see `flow/interrupt.py`), and emit extra rows (`model_calls`, `prompt_sections`, ...)
tied to its step. Everything it records goes into the step's recorder, which the
runner hands to the sinks. A step of a `Pipeline.map` fan-out finds its element in
`ctx.item`.
"""
from __future__ import annotations

import copy
import inspect
import json
import time
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Iterator, Mapping, NamedTuple, Optional, Sequence

from ..errors import TracememError
from ..ids import new_id
from ..scope.tracked import unwrap
from .answers import check_answer, expect_ref
from .effects import LIVE, EffectPolicy, effect_hash, replayed_result
from .interrupt import Answer, Pause, PauseSignal, json_text
from .replay import ReplayModel, request_hash
from ..exchange import Exchange, exchange_of, output_row
from ..masking import credentials, run_masker
from ..models import ModelConfigError
from ..models.messages import wire_message
from ..record import EXTRA_TABLES

if TYPE_CHECKING:
    from ..run import Run
    from ..scope.recorder import StepRecorder
    from .events import EventFeed


WITHHELD = "this run replays a record that does not hold this effect; it is not made again unless asked"


class Replayed(NamedTuple):
    """An effect answered from the record (what `StageContext._effect_begin` gives instead of running it)."""

    result: Any


class StageContext:
    """What a stage may know besides the scope.

    `args` is the run input (read-only); `env` holds untracked dependencies such as
    model clients (`flow.run(..., env={...})`), never recorded; `store` is the Store
    the run records into (or None); `subject` is whose run this is (memory scoping);
    `pipeline` is the name of the pipeline running; `item` is this step's element when
    the stage runs once per element of a list (`Pipeline.map`), else None.
    """

    __slots__ = ("run_id", "step", "stage", "name", "iteration", "args", "env", "subject", "store", "run",
                 "pipeline", "item", "_rec", "_answers", "_asked", "_replay", "_events", "_effects", "_made")

    def __init__(self, run: "Run", rec: "StepRecorder", name: str, iteration: int, args: Mapping[str, Any],
                 env: Mapping[str, Any], store: Any, answers: Optional[Sequence[Answer]] = (),
                 replay: Any = None, *, item: Any = None, events: Optional["EventFeed"] = None,
                 effects: EffectPolicy = LIVE) -> None:
        self.run_id = run.run_id
        self.run = run
        self.pipeline = run.pipeline
        self.step = rec.step
        self.stage = rec.stage
        self.name = name
        self.iteration = iteration
        self.args = args
        self.env = env
        self.subject = run.subject
        self.store = store
        self.item = item
        self._rec = rec
        self._answers = answers  # None: a fork branch, which cannot pause
        self._asked = 0
        self._replay = replay  # a ReplayBook: calls whose exact request it holds are answered from it
        self._events = events  # set while the run streams events: tokens go there as they arrive
        self._effects = effects  # live, or replayed from a record (flow/effects.py)
        self._made: dict[str, int] = {}  # effects made so far in this step, by name (their keys count them)

    @property
    def without(self) -> frozenset[str]:
        """The sources ("memory:m_…", "run:…", "section:KIND:ID") this run leaves out: a counterfactual run
        (`trace.counterfactual`) asks recall, prompt assembly and load_snapshot to act as if they were gone."""
        return self.run.without

    def excluded(self, kind: str, source_id: Optional[str]) -> bool:
        """Whether this run leaves out the source `kind:source_id` (see `without`)."""
        return bool(self.run.without) and source_id is not None and f"{kind}:{source_id}" in self.run.without

    def break_loop(self, reason: str = "") -> None:
        """Leave the innermost loop after this stage (recorded as a 'break' decision)."""
        self._rec.break_reason = reason or "break_loop() called"

    def interrupt(self, payload: Any = None, *, expect: Any = None) -> Any:
        """Pause the run for a human and return their answer.

        The first time, the run ends with status `paused` and `run.pending == payload` (JSON-able).
        `flow.resume(run, answer)` re-enters this stage from its start, and this call returns `answer`,
        validated as `expect` when given (a class importable by module and name: a pydantic model, a
        dataclass, `bool`, ...; a resume checks the answer before anything is committed, and a bad one
        leaves the run paused, see flow/answers.py). Work before the call is done again on re-entry,
        except model calls and recorded effects, which are answered from the record (flow/interrupt.py)."""
        if self._answers is None:
            raise TracememError(
                f"ctx.interrupt() in fork branch '{self.stage}' (run {self.run_id}): fork branches run together "
                f"and commit together, so one cannot pause alone; ask in a stage before or after the fork")
        ref = expect_ref(expect)
        asked, self._asked = self._asked, self._asked + 1
        if asked < len(self._answers):
            given = self._answers[asked]
            return given.answer if expect is None else check_answer(
                expect, given.answer, given.payload, f"stage '{self.stage}' of run {self.run_id}")
        json_text(payload)  # refused now if it cannot be recorded
        self._rec.pause = Pause(payload, self.stage, "interrupt", self.step, expect=ref)
        raise PauseSignal(f"stage '{self.stage}' paused run {self.run_id} for an answer (ctx.interrupt)")

    def effect(self, name: str, fn: Callable[[str], Any], *, input: Any = None, kind: str = "call",
               key: Optional[str] = None) -> Any:
        """Make a side effect once: `fn(idempotency_key)` runs (an HTTP POST, a payment, an e-mail) and what
        it returns is recorded (as JSON) with `input`, which identifies it. A run that re-executes recorded work
        (a resume re-entering this stage, a `replay=True` fork, a counterfactual) gets the recorded result back
        instead of running it again; see flow/effects.py. The key, `run id:step:name#n` (or `:key` when given),
        is the same when a crashed run resumes and this step runs again: pass it to APIs that take one."""
        ready = self._effect_begin(kind, name, input, key)
        if isinstance(ready, Replayed):
            return ready.result
        started = time.time_ns()
        try:
            result = fn(ready[3])
        except PauseSignal:  # it asked a person before making anything: no effect to record
            raise
        except Exception as err:
            self.record_effect(*ready, "live", None, f"{type(err).__name__}: {err}", started)
            raise
        self.record_effect(*ready, "live", result, None, started)
        return result

    async def aeffect(self, name: str, fn: Callable[[str], Awaitable[Any]], *, input: Any = None,
                      kind: str = "call", key: Optional[str] = None) -> Any:
        """`effect` for an async `fn`."""
        ready = self._effect_begin(kind, name, input, key)
        if isinstance(ready, Replayed):
            return ready.result
        started = time.time_ns()
        try:
            result = await fn(ready[3])
        except PauseSignal:
            raise
        except Exception as err:
            self.record_effect(*ready, "live", None, f"{type(err).__name__}: {err}", started)
            raise
        self.record_effect(*ready, "live", result, None, started)
        return result

    @property
    def effects(self) -> EffectPolicy:
        """How this step treats side effects: made live, or replayed from a record (flow/effects.py)."""
        return self._effects

    def _effect_begin(self, kind: str, name: str, input: Any, key: Optional[str]) -> Any:
        """A replayed effect (`Replayed`), or what making it needs: (kind, name, input hash, key); pauses the
        run instead when it replays a record that does not hold this effect."""
        n = self._made[name] = self._made.get(name, 0) + 1
        h = effect_hash(kind, name, input)
        ident = (kind, name, h, f"{self.run_id}:{self.step}:{key if key is not None else f'{name}#{n}'}")
        row = self._effects.recorded(kind, name, h)
        if row is not None:
            self.record_effect(*ident, "replayed", replayed_result(row), None, time.time_ns(), source=row)
            return Replayed(replayed_result(row))
        if self._effects.withholds:
            self.withhold(name, kind, input)
        return ident

    def withhold(self, name: str, kind: str, input: Any) -> None:
        """Pause the run before an effect its replayed record does not hold (it is not made)."""
        self._rec.pause = Pause({"effect": name, "kind": kind, "input": input, "why": WITHHELD}, self.stage,
                                "effect", self.step)
        raise PauseSignal(f"stage '{self.stage}' would make the effect {name!r}, which the record this run "
                          f"replays does not hold: paused instead (resume with live_effects=True to make it)")

    def record_effect(self, kind: str, name: str, h: str, key: str, mode: str, result: Any, error: Optional[str],
                      started: int, source: Optional[Mapping[str, Any]] = None) -> None:
        """An `effects` row of this step: made live (`source` None) or replayed from the recorded `source`."""
        origin = (self.run_id, self.step) if source is None else (
            source.get("source_run_id") or source.get("run_id"), source.get("source_step") or source.get("step"))
        self.emit("effects", idx=sum(1 for table, _ in self._rec.rows if table == "effects"), kind=kind, name=name, input_hash=h,
                  idempotency_key=key if source is None else source.get("idempotency_key"), mode=mode,
                  source_run_id=origin[0], source_step=origin[1], result=json.dumps(result, default=str),
                  error=error, started_at=started, duration_ms=(time.time_ns() - started) / 1e6)

    @property
    def answer(self) -> Any:
        """The answer this step was resumed with (its first one), or None: how a stage behind a
        `pause_before=True` point reads the answer the run was resumed with."""
        return self._answers[0].answer if self._answers else None

    def log(self, message: str) -> None:
        """A line kept with this step (`steps.logs`)."""
        self._rec.add_log(str(message))

    def degrade(self, reason: str) -> None:
        """Mark the run degraded: it still ends `ok`, but did less than it should (e.g. memory extraction
        failed). The reason, prefixed with this stage's id, goes to `runs.degraded` (shown by `tracemem runs`,
        `show` and `store.runs()`) and to this step's log; several reasons are joined with "; "."""
        text = f"{self.stage}: {str(reason).strip() or 'degraded'}"
        self.run.degraded = text if not self.run.degraded else f"{self.run.degraded}; {text}"
        self._rec.add_log(f"degraded: {reason}")

    def span(self, name: str, *, kind: str = "internal", attributes: Optional[dict[str, Any]] = None,
             start_ns: Optional[int] = None, end_ns: Optional[int] = None) -> None:
        """Telemetry for OpenTelemetry export only (never stored): e.g. memory recall's `retrieval` span."""
        self._rec.add_row("_span", {"name": name, "kind": kind, "attributes": dict(attributes or {}),
                                    "start_ns": start_ns, "end_ns": end_ns})

    def emit(self, table: str, **row: Any) -> dict[str, Any]:
        """Record an extra row (e.g. `model_calls`, `prompt_sections`) tied to this step; a table the store does
        not have is refused here, where the stage names it."""
        if table not in EXTRA_TABLES and not table.startswith("_"):  # ("_": telemetry rows, never stored)
            raise TracememError(f"stage '{self.stage}' emitted a row for unknown table '{table}'; "
                                f"known: {', '.join(sorted(EXTRA_TABLES))}")
        row = {"run_id": self.run_id, "step": self.step, **row}
        self._rec.add_row(table, row)
        return row

    def complete(self, model: Any, messages: list[Any], *, prompt_id: Optional[str] = None,
                 **options: Any) -> Any:
        """Call `model.complete(messages, **options)` and record the call as a `model_calls` row of this
        step: model, provider, prompt id, reply, the tool calls it asked for, tokens, latency, and the
        error if it failed (then re-raised; a stream cut off mid-reply records what arrived).

        Options go to the model as given (`tools=`, `tool_choice=`, `schema=`, `on_token=`). While the
        run streams events (`flow.stream`), the reply streams too and each text fragment becomes a
        `TokenDelta`; the recorded row is the same either way. The row keeps the hash of the exact
        request (`request_hash`: model name, messages, every option), so the call can be replayed
        later; when the run replays a record (`flow.fork(..., replay=True)`, a resumed stage's calls
        before its pause), a request found there is answered from it and the row says `replayed`.
        The exact request itself is recorded too, content-addressed (tracemem/exchange.py): the row
        names its system instructions, its messages, its tools and the reply, each stored once."""
        self._rec.state.secrets.update(credentials(model))  # masked in everything the step records
        name = getattr(model, "name", None)
        messages = [unwrap(m) for m in messages]  # a scope's tracked copies go out (and are hashed) as plain messages
        h = request_hash(name, messages, options)
        call = {"call_id": new_id(48), "model": name, "provider": getattr(model, "provider", None),
                "prompt_id": prompt_id or None, "request_hash": h}
        exchange = self._exchange(messages, options)
        call.update(exchange.columns)
        events = self._events
        if events is not None and _takes_on_token(model):
            options["on_token"] = events.token_callback(self.run_id, self.step, self.stage, options.get("on_token"))
        started = time.time_ns()
        try:
            if self._replay is not None:
                reply = ReplayModel(self._replay, live=model, name=name).answer(h, messages, options)
            elif isinstance(model, ReplayModel):
                reply = model.answer(h, messages, options)
            else:
                reply = model.complete(messages, **options)
        except Exception as err:
            partial = getattr(err, "partial", None)  # ModelError: a stream broke; keep what arrived
            self._emit_exchange(exchange, call["call_id"], partial)
            self.emit("model_calls", **{**call, **(reply_columns(partial, call["model"]) if partial is not None else
                                                   {"response": None, "input_tokens": None, "output_tokens": None,
                                                    "tool_calls": None})},
                      latency_ms=(time.time_ns() - started) / 1e6, started_at=started,
                      error=f"{type(err).__name__}: {err}", replayed=False,
                      output_id=self._output_id(partial))
            raise
        self._emit_exchange(exchange, call["call_id"], reply)
        self.emit("model_calls", **{**call, **reply_columns(reply, name)}, latency_ms=(time.time_ns() - started) / 1e6,
                  started_at=started, error=None, replayed=bool(getattr(reply, "replayed", False)),
                  output_id=self._output_id(reply))
        if events is not None and getattr(reply, "tool_calls", None):
            events.tool_requested(self.run_id, self.step, self.stage, reply.tool_calls)
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
        rec = self._rec
        masker = run_masker(rec.state.schema.secret, rec.state.data, rec.state.secrets, rec.overlay)
        return masker.value if masker else _same

    def _emit_exchange(self, exchange: Exchange, call_id: str, reply: Any) -> None:
        """The content rows the call adds, and the whole request for telemetry (`_exchange`, never stored)."""
        for table, row in exchange.rows:
            self._rec.add_row(table, row)
        self._rec.add_row("_exchange", {"call_id": call_id, "system": exchange.system, "messages": exchange.messages,
                                        "tools": exchange.tools, "options": exchange.options})

    def _output_id(self, reply: Any) -> Optional[str]:
        """The reply's message id (its `messages` row added when new); None without a reply."""
        message = getattr(reply, "message", None) if reply is not None else None
        output_id, rows = output_row(message.wire() if message is not None else None, self.run_id,
                                     getattr(self.store, "known_content", None), self._masking())
        for table, row in rows:
            self._rec.add_row(table, row)
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


EMPTY: Mapping[str, Any] = MappingProxyType({})

_PLAIN = (int, str, float, bool, type(None), bytes)


class ReadOnlyArgs(Mapping[str, Any]):
    """`ctx.args`: the run input. Each access to a container hands out a fresh copy, so
    mutating it can never reach the scope (or a later stage's args) unrecorded."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._data = data

    def __getitem__(self, key: str) -> Any:
        value = self._data[key]
        if isinstance(value, _PLAIN):
            return value
        try:
            return copy.deepcopy(value)
        except Exception:  # an uncopyable value (a lock, a client) is shared, as env is
            return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"ReadOnlyArgs({dict(self._data)!r})"
