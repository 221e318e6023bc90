"""The values a run's steps pass around: a step that has begun (`Begun`), the loops' state (`LoopState`),
where a run starts when it does not start afresh (`StartPoint`), what a re-entered step is handed
(`deliver`), and the two signals that end a run early (failed, paused).

They sit apart from the runner so that the node kinds (flow/kinds.py, parallel.py, subflow.py) and
`flow/resume.py`, which rebuilds an execution's state from a recorded run, use them without the runner.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from ..errors import TracememError
from ..record import Decision, StepKind
from ..scope.recorder import RunState, StepRecorder
from .answers import check_answer
from .effects import EffectPolicy
from .interrupt import Delivery, Pause
from .program import Instruction
from .spec import StageSpec

BESIDE_OTHERS = frozenset({"fork-branch", "map-item", "tool"})  # step kinds that run beside others
MAPPED = frozenset({"map-item", "tool"})  # ... of them, a map's: they may pause (the whole map pauses)


class Begun:
    """A step that has started: its spec, recorder, kind, iteration, start time and routing decision."""

    __slots__ = ("spec", "rec", "kind", "iteration", "started", "routed_by", "child_run_id", "answers", "replay",
                 "item", "effects")

    def __init__(self, spec: StageSpec, state: RunState, step: int, kind: StepKind, iteration: int,
                 routed_by: Optional[int]) -> None:
        beside = kind in BESIDE_OTHERS
        self.spec, self.kind, self.iteration, self.routed_by = spec, kind, iteration, routed_by
        self.rec = StepRecorder(state, step, spec.id, beside)
        self.started = time.time_ns()
        self.child_run_id: Optional[str] = None
        # what ctx.interrupt returns (None: it cannot, in a fork branch, which commits with the others)
        self.answers: Any = None if beside and kind not in MAPPED else ()
        # a re-entered stage: its model calls and effects before the pause, to answer from; a map step's element
        self.replay = self.item = self.effects = None


class LoopState:
    """Control-flow memory of a run: the decision that last routed into each region, how often each
    loop went round, and the key each branch last chose."""

    def __init__(self) -> None:
        self.last_decision: dict[Any, int] = {}
        self.rounds: dict[Any, int] = {}
        self.branch_keys: dict[int, str] = {}

    def routed_by(self, ins: Instruction) -> Optional[int]:
        """The latest decision among those that routed into the regions holding `ins`."""
        best = None
        for region in ins.regions:
            step = self.last_decision.get(region.key)
            if step is not None and (best is None or step > best):
                best = step
        return best

    def go_round(self, key: Any, decided_by: Optional[int]) -> int:
        """Count one more round of a loop (returns the count)."""
        count = self.rounds.get(key, 0) + 1
        self.rounds[key] = count
        if decided_by is not None:
            self.last_decision[key] = decided_by
        return count

    def leave(self, key: Any) -> None:
        """A loop was left: its count and routing start afresh next time."""
        self.rounds.pop(key, None)
        self.last_decision.pop(key, None)

    def break_out(self, ins: Instruction, begun: Begun) -> tuple[Decision, int]:
        """`ctx.break_loop()`: leave the innermost loop around `ins` (an error outside any loop); the decision
        recorded on the step, and the instruction after the loop."""
        loops = [r for r in ins.regions if isinstance(r.key, tuple)]
        if not loops:
            raise TracememError(f"stage '{begun.spec.id}' called break_loop() but is not inside a loop")
        region = max(loops, key=lambda r: r.start)
        self.leave(region.key)
        return Decision(begun.rec.step, "break", {"reason": begun.rec.break_reason, "loop": region.name}), region.exit


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
    loops: Optional[LoopState] = None  # its loops' state (None: a fresh one)
    prelude: Any = None  # a fork's edits (a StageSpec), run as its first step
    deliver: Optional[Delivery] = None  # what the stage it re-enters gets (answers, recorded calls and effects)
    gate: int = -1  # a `pause_before` point already answered
    replay: Any = None  # a ReplayBook: model calls answered from a record
    effects: Optional[EffectPolicy] = None  # side effects replayed from a record (None: made live)
    resume_child: Optional[tuple[str, Any]] = None  # a subflow id, and its paused child's Execution resuming
    resumed: Optional[tuple[Any, ...]] = None  # a resumed run: how much of its record there was (RunStarted)
