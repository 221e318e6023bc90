"""What the runner does around steps that run at once: a fork's branches and a map's elements.

Each such step goes the runner's one step path (`_begin`, `_call`, `_fail`, `_record`);
what differs is around it: all are begun first (numbered in declared or element order),
run together (`fork.run_branches`: threads for sync stages, `asyncio.gather` for
async), then committed in that order — appends to one list merge in it — or, if one
failed or two wrote the same path, none is committed and each is recorded failed.
A map runs its stage once per element of a list field, the element in `ctx.item`,
read through the step's recorder (a read of the field, so backtracking links each
step to the write that put its element there).

`Execution` (flow/runner.py) inherits these; they only use its step path.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Awaitable, Callable, Optional

from ..errors import TracememError
from ..scope.tracked import private_copy
from .fork import fork_conflict, merge_branch, run_branches
from .program import Instruction
from .spec import StageSpec
from .steps import Abort, Begun, Paused, deliver



class ParallelSteps:
    """The fork and map node kinds of `Execution` (flow/runner.py), which inherits them: they use its step
    path (`_begin`, `_call`, `_fail`, `_record`, `_break`, `state`, `async_mode`), not named here since
    runner.py imports this module."""

    async def _do_fork(self, ins: Instruction, pc: int) -> int:
        begun = [self._begin(ins, spec, "fork-branch") for spec in ins.node.branches]
        return await self._parallel(ins, begun, [s.id for s in ins.node.branches], pc)

    async def _do_map(self, ins: Instruction, pc: int) -> int:
        spec: StageSpec = ins.spec  # type: ignore[assignment]
        over = ins.node.over
        begun = [self._begin(ins, spec, spec.kind) for _ in range(len(self.state.data.get(over) or ()))]
        delivery, self.deliver = (self.deliver, None) if self.deliver and self.deliver.stage == spec.id else \
            (None, self.deliver)  # a map that paused, re-entered: each step gets what its stage made before
        for i, b in enumerate(begun):  # the element, read through the step's recorder (a read of `over`), a copy
            b.item = private_copy(b.rec.read(over, tracked=False)[i])  # (no tracked copy of the whole list)
            if delivery is not None:
                deliver(b, delivery, self.effects, self.run.run_id, i == delivery.item)
        return await self._parallel(ins, begun, [f"{spec.id}[{i}]" for i in range(len(begun))], pc) if begun \
            else pc + 1

    async def _parallel(self, ins: Instruction, begun: list[Begun], labels: list[str], pc: int) -> int:
        """Run begun steps at once (a fork's branches, a map's elements); commit them in order, or none."""
        outcomes = await run_branches(lambda i: self._call(begun[i]), [b.spec.is_async for b in begun],
                                      self.async_mode)
        for b, outcome in zip(begun, outcomes):
            b.started = outcome.started
        mapped = ins.op == "map"  # (a fork branch cannot pause: its pause signal is an error)
        failed_at = next((i for i, (b, o) in enumerate(zip(begun, outcomes))
                          if o.error is not None and not (mapped and b.rec.pause is not None)), -1)
        asked = next((i for i, b in enumerate(begun) if b.rec.pause is not None), -1) if mapped else -1
        if failed_at < 0 and asked >= 0:  # a map's step asked a person (or held an effect back): the map pauses
            for b, outcome in zip(begun, outcomes):  # whole, and is entered again on resume (what its steps
                self.counts[b.spec.id] -= 1          # made then is answered from the record)
                self._record(b, "paused", None, None, outcome.ended)
            raise Paused(replace(begun[asked].rec.pause, item=asked), self.program.ids.get(ins.id))
        failure: Optional[BaseException] = outcomes[failed_at].error if failed_at >= 0 else fork_conflict(
            labels, [b.rec for b in begun])
        decision, next_pc = None, pc + 1
        breaker = next((i for i, b in enumerate(begun) if b.rec.break_reason is not None), -1)
        if failure is None and breaker >= 0:  # a branch called break_loop(): leave the loop after the fork
            decision, next_pc = self._break(ins, begun[breaker])
        if failure is not None:
            abort: Optional[Abort] = None
            for b, outcome in zip(begun, outcomes):
                own = outcome.error
                err = own if own is not None else failure if failed_at < 0 else TracememError(
                    f"not committed: parallel step '{labels[failed_at]}' failed")
                a = self._fail(b, err)
                abort = abort or (a if own is not None or failed_at < 0 else None)
            raise abort or Abort(str(failure), failure)
        for i, (b, outcome) in enumerate(zip(begun, outcomes)):
            merge_branch(self.state, b.rec)
            self._record(b, "ok", None, decision if i == breaker else None, outcome.ended)
        return next_pc


# The runner's handlers for these kinds (`flow/runner.py` HANDLERS).
PARALLEL_HANDLERS: dict[str, Callable[..., Awaitable[int]]] = {"fork": ParallelSteps._do_fork,
                                                               "map": ParallelSteps._do_map}
