"""What each node kind does around the runner's one step path (`Execution.step`, flow/runner.py).

A stage runs once (a `pause_before` point first asks); a decider's key picks the next
instruction, and a branch that goes back counts a loop round against its guard; a
`loop_to` with a predicate is a step of its own whose result says whether to go round.
Each handler takes the execution, the instruction and its index, and returns the next
index. Forks and maps (flow/parallel.py) and subflows (flow/subflow.py) are the others.
"""
from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Optional

from ..errors import LoopLimitError, TracememError
from ..record import Decision
from .interrupt import Pause
from .parallel import run_fork, run_map
from .program import Instruction
from .runner import Execution
from .spec import LoopNode, StageSpec
from .steps import Begun, Paused
from .subflow import run_subflow


async def run_stage(exe: Execution, ins: Instruction, pc: int) -> int:
    """A stage: its step, then the next instruction (or out of a loop, when it called `ctx.break_loop`)."""
    spec: StageSpec = ins.spec  # type: ignore[assignment]
    if spec.pause_before:
        if exe.gate != pc:
            raise Paused(Pause({"before": ins.id}, str(ins.id), "before", expect=spec.expect), pc)
        exe.gate = -1  # answered: pass once
    after = [pc + 1]

    def conclude(begun: Begun, result: Any) -> Optional[Decision]:
        if begun.rec.break_reason is None:
            return None
        decision, after[0] = exe.loops.break_out(ins, begun)
        return decision

    await exe.step(ins, spec, "stage", conclude)
    return after[0]


async def run_branch(exe: Execution, ins: Instruction, pc: int) -> int:
    """A decider: the arm its key names; a key that loops back counts a round of that loop."""
    spec: StageSpec = ins.spec  # type: ignore[assignment]
    loop_key = ("loop", pc)

    def conclude(begun: Begun, key: Any) -> Decision:
        if key not in ins.targets and not isinstance(key, str) and str(key) in ins.targets:
            key = str(key)  # arm keys are strings: `{True: ..., False: ...}` matches a bool decider
        if key not in ins.targets:
            raise TracememError(f"decider '{spec.id}' returned {key!r}, which is not one of its branches: "
                                f"{', '.join(ins.targets)}")
        if key in ins.loop_keys:
            limit = exe.program.max_iterations
            if exe.loops.rounds.get(loop_key, 0) + 1 > limit:
                raise LoopLimitError(
                    f"loop '{spec.id}→{ins.node.arms[key]}' in pipeline '{exe.program.name}' exceeded "
                    f"max_iterations={limit} (decider '{spec.id}' kept choosing '{key}'); make it exit or raise "
                    f"Pipeline(..., max_iterations=...)")
            exe.loops.go_round(loop_key, begun.rec.step)
        elif loop_key in exe.loops.rounds:
            exe.loops.leave(loop_key)
        exe.loops.last_decision[pc] = begun.rec.step
        exe.loops.branch_keys[pc] = key
        rec = begun.rec
        return Decision(rec.step, key, rec.evidence if rec.evidence is not None else {"returned": key})

    begun, _ = await exe.step(ins, spec, "decider", conclude)
    return ins.targets[exe.loops.branch_keys[pc]]


async def run_loop(exe: Execution, ins: Instruction, pc: int) -> int:
    """`loop_to`: back to its target while `when` holds (the branch before it chose `when`, or the predicate,
    a step of its own, returned true), within `max_iterations`."""
    node: LoopNode = ins.node
    loop_key, when = ("loop", pc), getattr(node.when, "__name__", node.when)
    limit = LoopLimitError(f"loop '{node.id}' back to '{node.target}' in pipeline '{exe.program.name}' exceeded "
                           f"max_iterations={node.max_iterations}; make the loop exit or raise max_iterations")
    if isinstance(node.when, str):  # decided by the branch before it: no step of its own
        if exe.loops.branch_keys.get(ins.branch_index) != node.when:
            exe.loops.leave(loop_key)
            return pc + 1
        if exe.loops.rounds.get(loop_key, 0) + 1 > node.max_iterations:
            spec = StageSpec(id=node.id, name=node.id, fn=None, kind="loop")
            await exe.step(ins, spec, "loop", body=_raise(limit))  # recorded as the failed step of the loop
        exe.loops.go_round(loop_key, exe.loops.last_decision.get(ins.branch_index))
        return ins.target
    spec = StageSpec(id=node.id, name=node.id, fn=node.when, kind="loop", is_async=asyncio.iscoroutinefunction(node.when))
    again = [False]

    def conclude(begun: Begun, result: Any) -> Decision:
        again[0] = bool(result)
        if not again[0]:
            exe.loops.leave(loop_key)
            return Decision(begun.rec.step, "exit", {"when": when})
        if exe.loops.rounds.get(loop_key, 0) + 1 > node.max_iterations:
            raise limit
        exe.loops.go_round(loop_key, begun.rec.step)
        return Decision(begun.rec.step, "continue", {"when": when})

    await exe.step(ins, spec, "loop", conclude)
    return ins.target if again[0] else pc + 1


def _raise(error: BaseException) -> Callable[[Begun], Awaitable[Any]]:
    async def body(begun: Begun) -> Any:
        raise error
    return body


async def run_jump(exe: Execution, ins: Instruction, pc: int) -> int:
    return ins.target


# What each instruction kind does (`Program` ops).
HANDLERS: dict[str, Callable[[Execution, Instruction, int], Awaitable[int]]] = {
    "jump": run_jump, "stage": run_stage, "branch": run_branch, "loop": run_loop, "fork": run_fork, "map": run_map,
    "subflow": run_subflow}


class Runner(Execution):
    """A run's execution with the node kinds bound: what `flow.run`, a resume and a fork start."""

    async def run_node(self, ins: Instruction, pc: int) -> int:
        return await HANDLERS[ins.op](self, ins, pc)
