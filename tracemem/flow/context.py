"""The optional second parameter of a stage: run facts, untracked dependencies, recorded model calls.

A stage that takes `ctx` can log lines kept with its step, leave a loop, call a
chat model so that the call is recorded (`ctx.complete`, flow/model_calls.py), make a
side effect once (`ctx.effect`, flow/step_effects.py), mark the run degraded while it
still succeeds (`ctx.degrade`), pause the run for a human (`ctx.interrupt`, see
flow/interrupt.py), and emit extra rows (`prompt_sections`, ...) tied to its step.
Everything it records goes into the step's recorder, which the runner turns into the
step's record and events. A step of a `Pipeline.map` fan-out finds its element in
`ctx.item`.
"""
from __future__ import annotations

import copy
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Iterator, Mapping, Optional, Sequence

from ..errors import TracememError
from ..record import EXTRA_TABLES
from .answers import check_answer, expect_ref
from .effects import LIVE, EffectPolicy
from .interrupt import Answer, Pause, PauseSignal, json_text
from .model_calls import ModelCallRecorder
from .step_effects import StepEffects

if TYPE_CHECKING:
    from ..run import Run
    from ..scope.recorder import StepRecorder
    from .events import EventFeed


class StageContext:
    """What a stage may know besides the scope.

    `args` is the run input (read-only); `env` holds untracked dependencies such as
    model clients (`flow.run(..., env={...})`), never recorded; `store` is the Store
    the run records into (or None); `subject` is whose run this is (memory scoping);
    `pipeline` is the name of the pipeline running; `item` is this step's element when
    the stage runs once per element of a list (`Pipeline.map`), else None.
    """

    __slots__ = ("run_id", "step", "stage", "name", "iteration", "args", "env", "subject", "store", "run",
                 "pipeline", "item", "effects", "_rec", "_answers", "_asked", "_replay", "_events")

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
        self.effects = StepEffects(rec, run.run_id, effects)  # made live, or replayed from a record

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
        return self.effects.make(name, fn, input, kind, key)

    async def aeffect(self, name: str, fn: Callable[[str], Awaitable[Any]], *, input: Any = None,
                      kind: str = "call", key: Optional[str] = None) -> Any:
        """`effect` for an async `fn`."""
        return await self.effects.amake(name, fn, input, kind, key)

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
        calls = ModelCallRecorder(self._rec, self.run_id, self.store, self._replay, self._events)
        return calls.complete(model, messages, prompt_id, options)


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
