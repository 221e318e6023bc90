"""Where a run starts when it does not start afresh (`StartPoint`), what a re-entered step is handed
(`deliver`), and the two signals that end a run early (failed, paused).

They sit apart from the runner so that `flow/resume.py`, which rebuilds an execution's
state from a recorded run, hands it to the runner as one value.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Optional

from ..errors import TracememError
from .answers import check_answer
from .effects import EffectPolicy
from .interrupt import Delivery, Pause

if TYPE_CHECKING:
    from .runner import Begun


class Abort(TracememError):
    """Ends a run as failed: the message recorded on the run, and the error behind it (internal: the
    runner raises and catches it; a caller sees `RunFailed`)."""

    def __init__(self, message: str, cause: BaseException) -> None:
        super().__init__(message)
        self.cause = cause


class Paused(TracememError):
    """Ends a run as paused (internal, like Abort): the pause, and the instruction it continues at."""

    def __init__(self, pause: Pause, pc: Optional[int]) -> None:
        super().__init__(f"paused at stage '{pause.stage}'")
        self.pause, self.pc = pause, pc


def deliver(begun: Begun, delivery: Delivery, effects: EffectPolicy, run_id: str, asked: bool) -> None:
    """Hand a re-entered step what its stage was given before it paused: the model calls and effects it made
    (answered from the record), and the answers, when it is the step that `asked` (recorded as human inputs)."""
    begun.replay, begun.effects = delivery.replay, effects.also(delivery.effects)
    if not asked:
        return
    begun.answers = delivery.answers
    for i, answer in enumerate(begun.answers):
        begun.rec.add_row("human_inputs", answer.row(run_id, begun.rec.step, i))
    if begun.spec.expect is not None and begun.answers:  # a pause_before point's answer, as its declared type
        a = begun.answers[0]
        begun.answers = [replace(a, answer=check_answer(begun.spec.expect, a.answer, a.payload, begun.spec.id))]


@dataclass
class StartPoint:
    """Where a run starts when it does not start afresh: a resumed run carries on (`run` is its own record), a
    fork starts a new one (`run` is the fork's record, `prelude` its edits). Built by flow/resume.py from a
    recorded run. Without `run`, a fresh run that replays a record (a replaying fork's subflow)."""

    run: Any = None  # the Run to record into (None: a fresh run)
    data: dict[str, Any] = field(default_factory=dict)  # its scope
    last_write: dict[str, tuple[int, int]] = field(default_factory=dict)  # each field's last write (step, seq)
    args: dict[str, Any] = field(default_factory=dict)  # what its stages see as `ctx.args`
    pc: int = 0  # the instruction to continue at
    next_step: int = 0  # the number of the last step recorded
    counts: dict[str, int] = field(default_factory=dict)  # executions per stage id
    loops: Any = None  # its loops' state (a LoopState, flow/runner.py; None: a fresh one)
    prelude: Any = None  # a fork's edits (a StageSpec), run as its first step
    deliver: Optional[Delivery] = None  # what the stage it re-enters gets (answers, recorded calls and effects)
    gate: int = -1  # a `pause_before` point already answered
    replay: Any = None  # a ReplayBook: model calls answered from a record
    effects: Optional[EffectPolicy] = None  # side effects replayed from a record (None: made live)
    resume_child: Optional[tuple[str, Any]] = None  # a subflow id, and its paused child's Execution resuming
    resumed: Optional[tuple[Any, ...]] = None  # a resumed run: how much of its record there was (RunStarted)
