"""What an executing run keeps besides its scope: the step in flight, the loops' state, and the two
signals that end a run early (failed, paused).

They sit apart from the runner so that `flow/resume.py`, which rebuilds an execution's
state from a recorded run, builds the very same objects (`LoopState` above all) that
the runner keeps while a run goes.
"""
from __future__ import annotations

from dataclasses import replace
from time import time_ns
from typing import Any, Optional

from ..errors import TracememError
from ..record import StepKind
from ..scope.recorder import RunState, StepRecorder
from .answers import check_answer
from .effects import EffectPolicy
from .interrupt import Delivery, Pause
from .program import Instruction
from .spec import StageSpec


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
        self.started = time_ns()
        self.child_run_id: Optional[str] = None
        # what ctx.interrupt returns (None: it cannot, in a fork branch, which commits with the others)
        self.answers: Any = None if beside and kind not in MAPPED else ()
        # a re-entered stage: its model calls and effects before the pause, to answer from; a map step's element
        self.replay = self.item = self.effects = None


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
