"""What the runner does around steps that run at once: a fork's branches and a map's elements.

Each such step goes the runner's step path in parts (`begin`, `call`, `fail`, `record`);
what differs is around it: all are begun first (numbered in declared or element order),
run together (`fork.run_branches`: threads for sync stages, `asyncio.gather` for
async), then committed in that order — appends to one list merge in it — or, if one
failed or two wrote the same path, none is committed and each is recorded failed.
A map runs its stage once per element of a list field, the element in `ctx.item`,
read through the step's recorder (a read of the field, so backtracking links each
step to the write that put its element there).

A map's step may pause (it asked a person, or held back an effect a replayed record
lacks): the whole map is recorded paused and entered again when the run resumes, each
step answered from the record for what it made before.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

from ..errors import TracememError
from ..scope.tracked import private_copy
from .fork import fork_conflict, merge_branch, run_branches
from .program import Instruction
from .runner import Execution
from .spec import StageSpec
from .steps import Abort, Begun, Paused, deliver


async def run_fork(exe: Execution, ins: Instruction, pc: int) -> int:
    """A fork: its branches at once, committed in declared order (or none)."""
    begun = [exe.begin(ins, spec, "fork-branch") for spec in ins.node.branches]
    return await _parallel(exe, ins, begun, [s.id for s in ins.node.branches], pc)


async def run_map(exe: Execution, ins: Instruction, pc: int) -> int:
    """A map: its stage once per element of the list field, at once, each step finding its element in `ctx.item`."""
    spec: StageSpec = ins.spec  # type: ignore[assignment]
    over = ins.node.over
    begun = [exe.begin(ins, spec, spec.kind) for _ in range(len(exe.state.data.get(over) or ()))]
    delivery, exe.deliver = (exe.deliver, None) if exe.deliver and exe.deliver.stage == spec.id else \
        (None, exe.deliver)  # a map that paused, re-entered: each step gets what its stage made before
    for i, b in enumerate(begun):  # the element, read through the step's recorder (a read of `over`), a copy
        b.item = private_copy(b.rec.read(over, tracked=False)[i])  # (no tracked copy of the whole list)
        if delivery is not None:
            deliver(b, delivery, exe.effects, exe.run.run_id, i == delivery.item)
    return await _parallel(exe, ins, begun, [f"{spec.id}[{i}]" for i in range(len(begun))], pc) if begun \
        else pc + 1


async def _parallel(exe: Execution, ins: Instruction, begun: list[Begun], labels: list[str], pc: int) -> int:
    """Run begun steps at once (a fork's branches, a map's elements); commit them in order, or none."""
    outcomes = await run_branches(lambda i: exe.call(begun[i]), [b.spec.is_async for b in begun],
                                  exe.async_mode, exe.program.pool)
    for b, outcome in zip(begun, outcomes):
        b.started = outcome.started
    mapped = ins.op == "map"  # (a fork branch cannot pause: its pause signal is an error)
    failed_at = next((i for i, (b, o) in enumerate(zip(begun, outcomes))
                      if o.error is not None and not (mapped and b.rec.pause is not None)), -1)
    asked = next((i for i, b in enumerate(begun) if b.rec.pause is not None), -1) if mapped else -1
    if failed_at < 0 and asked >= 0:  # a map's step asked a person (or held an effect back): the map pauses
        for b, outcome in zip(begun, outcomes):  # whole, and is entered again on resume (what its steps
            exe.counts[b.spec.id] -= 1           # made then is answered from the record)
            exe.record(b, "paused", None, None, outcome.ended)
        raise Paused(replace(begun[asked].rec.pause, item=asked), exe.program.ids.get(ins.id))
    failure: Optional[BaseException] = outcomes[failed_at].error if failed_at >= 0 else fork_conflict(
        labels, [b.rec for b in begun])
    decision, next_pc = None, pc + 1
    breaker = next((i for i, b in enumerate(begun) if b.rec.break_reason is not None), -1)
    if failure is None and breaker >= 0:  # a branch called break_loop(): leave the loop after the fork
        try:
            decision, next_pc = exe.loops.break_out(ins, begun[breaker])
        except TracememError as err:
            failure, failed_at = err, breaker
    if failure is not None:
        raise _failed(exe, begun, outcomes, labels, failure, failed_at)
    for i, (b, outcome) in enumerate(zip(begun, outcomes)):
        merge_branch(exe.state, b.rec)
        exe.record(b, "ok", None, decision if i == breaker else None, outcome.ended)
    return next_pc


def _failed(exe: Execution, begun: list[Begun], outcomes: list[Any], labels: list[str], failure: BaseException,
            failed_at: int) -> Abort:
    """Record every step of a parallel set failed (none committed); the abort of the one that failed first."""
    abort: Optional[Abort] = None
    for i, (b, outcome) in enumerate(zip(begun, outcomes)):
        own = outcome.error if outcome.error is not None else (failure if i == failed_at else None)
        err = own if own is not None else failure if failed_at < 0 else TracememError(
            f"not committed: parallel step '{labels[failed_at]}' failed")
        a = exe.fail(b, err)
        abort = abort or (a if own is not None or failed_at < 0 else None)  # type: ignore[assignment]
    return abort or Abort(str(failure), failure)
