"""Where a recorded run stands after any step: its scope, and its place in the program.

Resuming and forking need an execution's state back, and a run's record holds all of
it, so nothing else is stored for them:
- the scope is the replay of the committed writes (thread-aware, as `run.state_at`),
  validated into the scope model, and each field's last write, so later reads trace
  to the right write;
- the place is found by driving the program over the recorded steps: each step names
  its stage, each decision the arm taken or whether a loop went round, so the drive
  rebuilds the instruction to continue at, the per-stage iteration counts and the
  loops' rounds exactly as the runner kept them (the same `LoopState`).
A step recorded `paused` is a stage that asked a human: the drive stays at it, so
the stage is re-entered; a `pause_before` point left no step, and the drive stops
in front of it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from ..errors import ResumeError
from ..record import Decision, Step
from ..scope.paths import root_of
from ..scope.replay import replay_thread
from .program import Instruction, Program
from .steps import LoopState

if TYPE_CHECKING:
    from ..run import Run

__all__ = ["Position", "locate", "scope_at", "initial_scope"]


@dataclass
class Position:
    """A recorded run's place in its program after some step."""

    pc: int  # the instruction to continue at
    counts: dict[str, int] = field(default_factory=dict)  # executions per stage id (the next one's iteration)
    loops: LoopState = field(default_factory=LoopState)
    paused: Optional[Step] = None  # the last step, when it paused: its stage is re-entered
    group: tuple[int, ...] = ()  # the paused steps re-entered with it (a map's: all of them)
    last: int = 0  # the number of the last step driven over


def locate(program: Program, run: "Run", upto: Optional[int] = None, start: Optional[Position] = None) -> Position:
    """Drive `program` over `run`'s steps (those numbered ≤ `upto`; all when None) from `start` (a fork's:
    where its source stood after the step it was forked after; its own `edit` step is not a stage)."""
    steps = [s for s in run.steps if (upto is None or s.step <= upto) and s.kind != "edit"]
    decisions = {d.step: d for d in run.decisions}
    pos = start or Position(0)
    ins_list, i = program.ins, 0
    while i < len(steps):
        if pos.pc >= len(ins_list):
            raise _mismatch(run, steps[i], "the end of the flow", program)
        ins = ins_list[pos.pc]
        if ins.op == "jump":
            pos.pc = ins.target
            continue
        if ins.op == "loop" and isinstance(ins.node.when, str):  # decided by the branch before it: no step
            again = pos.loops.branch_keys.get(ins.branch_index) == ins.node.when
            _loop(pos, ins, again, pos.loops.last_decision.get(ins.branch_index))
            continue
        if ins.op == "fork":
            i = _fork(pos, ins, steps, i, decisions, run, program)
            continue
        if ins.op == "map":
            i = _map(pos, ins, steps, i, decisions, run)
            continue
        s = steps[i]
        if s.stage != ins.id:
            raise _mismatch(run, s, f"stage '{ins.id}'", program)
        i += 1
        pos.last = s.step
        if s.status == "paused":  # asked a human: its stage is entered again
            pos.paused, pos.group = s, (s.step,)
            continue
        if s.status != "ok":
            raise ResumeError(f"run {run.run_id}: step {s.step} ({s.stage}) failed; a run continues only from "
                              f"a step that finished: pick an earlier step")
        pos.paused = None
        pos.counts[s.stage] = pos.counts.get(s.stage, 0) + 1
        _advance(pos, ins, s, decisions.get(s.step))
    return pos


def _advance(pos: Position, ins: Instruction, s: Step, d: Optional[Decision]) -> None:
    """Move past a finished step of a stage, subflow, decider or loop predicate (as the runner did)."""
    if ins.op in ("stage", "subflow"):
        pos.pc = _break(pos, ins) if d is not None and d.chosen == "break" else pos.pc + 1
    elif ins.op == "branch":
        key = d.chosen if d is not None else None
        if key not in ins.targets:
            raise ResumeError(f"decider '{ins.id}' (step {s.step}) chose {key!r}, which this flow's branch does not "
                              f"have (arms: {', '.join(ins.targets)}): the flow changed since the run")
        loop_key = ("loop", pos.pc)
        if key in ins.loop_keys:
            pos.loops.go_round(loop_key, s.step)
        elif loop_key in pos.loops.rounds:
            pos.loops.leave(loop_key)
        pos.loops.last_decision[pos.pc] = s.step
        pos.loops.branch_keys[pos.pc] = key
        pos.pc = ins.targets[key]
    else:  # a loop with a predicate: its step decided whether to go round
        _loop(pos, ins, d is not None and d.chosen == "continue", s.step)


def _loop(pos: Position, ins: Instruction, again: bool, decided_by: Optional[int]) -> None:
    loop_key = ("loop", pos.pc)
    if again:
        pos.loops.go_round(loop_key, decided_by)
        pos.pc = ins.target
    else:
        pos.loops.leave(loop_key)
        pos.pc += 1


def _break(pos: Position, ins: Instruction) -> int:
    """`ctx.break_loop()`: leave the innermost loop around `ins`, as the runner's `_break` does."""
    region = max((r for r in ins.regions if isinstance(r.key, tuple)), key=lambda r: r.start)
    pos.loops.leave(region.key)
    return region.exit


def _fork(pos: Position, ins: Instruction, steps: list[Step], i: int, decisions: dict[int, Decision],
          run: "Run", program: Program) -> int:
    branches = [spec.id for spec in ins.node.branches]
    group = steps[i:i + len(branches)]
    for s, branch in zip(group, branches):
        if s.stage != branch:
            raise _mismatch(run, s, f"fork branch '{branch}'", program)
        if s.status != "ok":
            raise ResumeError(f"run {run.run_id}: step {s.step} (fork branch {s.stage}) failed; a run continues "
                              f"only from a step that finished: pick a step before the fork")
    if len(group) < len(branches):
        raise ResumeError(f"run {run.run_id}: step {group[-1].step} is one branch of fork '{ins.id}', whose "
                          f"branches run and commit together: continue after step {group[-1].step + len(branches) - len(group)} "
                          f"(its last branch) or before step {group[0].step}")
    for s in group:
        pos.counts[s.stage] = pos.counts.get(s.stage, 0) + 1
    pos.last = group[-1].step
    pos.paused = None
    broke = any(d.chosen == "break" for d in (decisions.get(s.step) for s in group) if d is not None)
    pos.pc = _break(pos, ins) if broke else pos.pc + 1
    return i + len(group)


def _map(pos: Position, ins: Instruction, steps: list[Step], i: int, decisions: dict[int, Decision],
         run: "Run") -> int:
    """Move past a map's steps (one per element, begun together; none for an empty list), as the runner did;
    a map whose steps paused (one of them asked, or held back an effect) is entered again."""
    group = []
    while i + len(group) < len(steps) and steps[i + len(group)].stage == ins.id \
            and steps[i + len(group)].kind in ("map-item", "tool"):
        group.append(steps[i + len(group)])
    if any(s.status == "failed" for s in group):
        raise ResumeError(f"run {run.run_id}: a step of map '{ins.id}' (steps {group[0].step}-{group[-1].step}) "
                          f"failed; a run continues only from a step that finished: pick a step before the map")
    if group:
        pos.last = group[-1].step
        if any(s.status == "paused" for s in group):
            item = (run.resume_at or {}).get("item") or 0
            pos.paused, pos.group = group[item if item < len(group) else 0], tuple(s.step for s in group)
            return i + len(group)
        pos.counts[ins.id] = pos.counts.get(ins.id, 0) + len(group)
    pos.paused = None
    broke = any(d.chosen == "break" for d in (decisions.get(s.step) for s in group) if d is not None)
    pos.pc = _break(pos, ins) if broke else pos.pc + 1
    return i + len(group)


def _mismatch(run: "Run", s: Step, expected: str, program: Program) -> ResumeError:
    return ResumeError(
        f"run {run.run_id} does not fit flow '{program.name}' (version {program.hash}): its step {s.step} ran "
        f"stage '{s.stage}' where this flow has {expected}; continue it with the flow that recorded it "
        f"(version {run.pipeline_hash})")


def scope_at(program: Program, run: "Run", upto: Optional[int]) -> tuple[dict[str, Any], dict[str, tuple[int, int]]]:
    """The scope after step `upto` (None: the end) as the scope model's field values, and each field's
    last write (step, seq) in this run. A run at hand gives its live values (secrets included); one
    loaded from a store is replayed, so its secret fields hold '<redacted>'."""
    schema = program.schema
    if upto is None:
        state = run.output if run.output is not None else run.state_at()  # (an interrupted run never ended)
    elif upto == 0:
        state = replay_thread(run.thread(), schema.default, 0)
    else:
        state = run.state_at(upto)
    if not isinstance(state, program.scope):
        state = schema.rebuild(state if isinstance(state, dict) else state.model_dump())
    data = {name: getattr(state, name) for name in schema.fields}
    last: dict[str, tuple[int, int]] = {}
    for w in run.committed_writes():
        if upto is None or w.step <= upto:
            last[root_of(w.path)] = (w.step, w.seq)
    return data, last


def initial_scope(program: Program, run: "Run") -> dict[str, Any]:
    """The scope a run started from (what its stages see as `ctx.args`)."""
    state = program.schema.rebuild(replay_thread(run.thread(), program.schema.default, 0))
    return {name: getattr(state, name) for name in program.schema.fields}
