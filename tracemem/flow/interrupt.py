"""Pausing a run for a human: the signal a stage raises, what a pause records, the answers it gets back.

`answer = ctx.interrupt(payload)` pauses the run the first time: the runner records
the stage's step as `paused` (its reads, logs and model calls kept, its writes never
committed) and ends the run with status `paused`, the payload in `run.pending`.
`flow.resume(run, answer)` re-enters that stage, and this time `ctx.interrupt` returns
the answer (the n-th call in the stage returns the n-th answer the stage was given,
so a stage may ask several questions, one pause each). A declared pause point,
`.then(fn, pause_before=True)`, pauses before the stage begins instead. Either may
declare the answer's type (`expect=`, flow/answers.py): a resume checks it first.

The rule for side effects (as in LangGraph): a stage that paused **re-runs from its
start** when resumed. Its writes before the pause were never committed, so nothing is
written twice; its model calls (`ctx.complete`) and recorded effects (tools,
`ctx.effect`) before the pause are answered from the record, so neither the model nor
the outside world is called again. Anything else it did before `ctx.interrupt` — an
HTTP POST not made through `ctx.effect` — happens again.
"""
from __future__ import annotations

import json
import types
from datetime import datetime, timezone
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Optional

from ..errors import PauseSignal, TracememError

__all__ = ["NO_ANSWER", "PauseSignal", "Pause", "Answer", "Delivery", "mentions_interrupt", "json_text"]

PauseKind = Literal["interrupt", "before", "subflow", "effect"]


class _NoAnswer:
    """`flow.resume(run)` given no answer: a stage that asked asks again (it pauses anew), a
    `pause_before` point lets its stage begin."""

    def __repr__(self) -> str:
        return "NO_ANSWER"


NO_ANSWER: Any = _NoAnswer()


@dataclass(frozen=True)
class Pause:
    """A pause: what it asks, the stage the run continues at, and how it paused — `interrupt` (the
    stage's step is recorded `paused`), `before` (a `pause_before` point: no step began) or `subflow`
    (a child run paused inside the subflow step)."""

    payload: Any
    stage: str
    kind: PauseKind
    step: Optional[int] = None  # the paused step (None for `before`)
    child_run_id: Optional[str] = None  # `subflow`: the child run that paused
    expect: Optional[str] = None  # the answer's type, by import path (flow/answers.py)
    item: Optional[int] = None  # a map's step that asked: its element's index

    def record(self, pc: Optional[int]) -> dict[str, Any]:
        """`runs.resume_at`: where and how the run continues (and what its answer must be)."""
        out: dict[str, Any] = {"stage": self.stage, "kind": self.kind, "step": self.step, "pc": pc}
        if self.child_run_id is not None:
            out["child_run_id"] = self.child_run_id
        if self.expect is not None:
            out["expect"] = self.expect
        if self.item is not None:
            out["item"] = self.item
        return out


@dataclass(frozen=True)
class Answer:
    """A human's answer to a pause, as a resumed stage receives it (`ctx.interrupt` returns `answer`)."""

    input_id: str
    answer: Any
    by: Optional[str]
    payload: Any  # what was asked
    answered_at: int  # ns since epoch
    asked_step: Optional[int] = None  # the paused step that asked (None: a `pause_before` point)

    def row(self, run_id: str, step: int, idx: int) -> dict[str, Any]:
        """Its `human_inputs` row in the step that received it."""
        return {"run_id": run_id, "step": step, "idx": idx, "input_id": self.input_id,
                "payload": json_text(self.payload), "answer": json_text(self.answer), "answered_by": self.by,
                "asked_step": self.asked_step, "answered_at": self.answered_at}

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> "Answer":
        """An answer recorded in `human_inputs` (delivered again when its stage is re-entered once more)."""
        return cls(row["input_id"], _loads(row.get("answer")), row.get("answered_by"), _loads(row.get("payload")),
                   _ns(row.get("answered_at")), row.get("asked_step"))


@dataclass
class Delivery:
    """What a resumed run hands the first step of `stage` (then nothing; a map: each of its steps): the
    answers (a map: to its step `item`, the one that asked), and the model calls (a ReplayBook) and effects
    (an EffectBook) the stage made before it paused, answered from them so they are not made again."""

    stage: str
    answers: list[Answer] = field(default_factory=list)
    replay: Any = None
    effects: Any = None
    item: Optional[int] = None


def json_text(value: Any) -> str:
    """JSON text of a payload or an answer; a clear error if it is not JSON-able (it is recorded)."""
    try:
        return json.dumps(value, sort_keys=True)
    except (TypeError, ValueError) as err:
        raise TracememError(f"{value!r} cannot be recorded: pauses and answers must be JSON-able "
                            f"(dicts, lists, strings, numbers, booleans, None) — {err}") from None


def _ns(at: Any) -> int:
    """ns since epoch from a live int or a loaded naive-UTC datetime."""
    if isinstance(at, datetime):
        return int(at.replace(tzinfo=timezone.utc).timestamp()) * 10**9 + at.microsecond * 1000
    return int(at or 0)


def _loads(text: Any) -> Any:
    return json.loads(text) if isinstance(text, str) else text


def mentions_interrupt(fn: Optional[Callable[..., Any]]) -> bool:
    """Whether a function's code (nested functions included) uses an attribute named `interrupt`: how a
    fork refuses, at build time, a branch that would pause (its branches commit together)."""
    code = getattr(getattr(fn, "func", fn), "__code__", None)
    return code is not None and _mentions(code)


def _mentions(code: types.CodeType) -> bool:
    if "interrupt" in code.co_names:
        return True
    return any(isinstance(c, types.CodeType) and _mentions(c) for c in code.co_consts)
