"""Continuing a recorded run: `flow.resume` (the same run, carrying on) and `flow.fork` (a new run).

Resume takes a run that is `paused` (it asked a human) or `interrupted` (its process
died, or was stopped), checks that this flow is the one that recorded it, claims it
in the store (one atomic UPDATE: two resumers cannot both win), rebuilds its state
from the record (`flow/position.py`) and hands the runner an Execution that starts
where the run stopped: same run id, step numbers carrying on, finished stages never
run again. The stage that asked is re-entered with the answers so far (the new one
recorded as a `human_inputs` row), its model calls before the pause answered from
the record. A pause inside a subflow paused the parent too: resuming the parent
resumes the child, with the answer.

Fork starts a new run from the state after any recorded step, with edits applied
as the fork's first step (kind `edit`, its writes validated like any write), and
records where it came from (`forked_from_run_id`, `forked_from_step`); with
`replay=True` every model call whose exact request the original recorded is
answered from the record (`flow/replay.py`).
"""
from __future__ import annotations

import time
from typing import Any, Iterable, Mapping, Optional, Sequence, TYPE_CHECKING, Union

from ..errors import PathError, ResumeError, RunNotFoundError, ScopeReadError, ScopeWriteError, TracememError
from ..ids import new_id
from ..run import Run
from ..scope.recorder import RunState, StepRecorder
from ..scope.recorder import new_view, write_path
from .answers import check_answer
from .interrupt import NO_ANSWER, Answer, Delivery, json_text
from .position import initial_scope, locate, scope_at
from .program import Program
from .effects import EffectBook, EffectPolicy
from .replay import ReplayBook
from .kinds import Runner
from .runner import PROCESS_SALT, Execution
from .steps import StartPoint
from .events import Listener
from .spec import StageSpec

if TYPE_CHECKING:
    from .position import Position

__all__ = ["resume_execution", "fork_execution"]

RESUMABLE = ("paused", "interrupted")


def _load(target: Union[Run, str], store: Any, verb: str) -> Run:
    if isinstance(target, Run):
        return target
    if not isinstance(target, str):
        raise ResumeError(f"{verb} takes a Run or a run id, got {target!r}")
    if store is None:
        raise ResumeError(f"{verb}('{target}') needs store=...: a run id is looked up in the store it was recorded in")
    return store.run(target)


def _check(program: Program, run: Run) -> None:
    """Refuse a run this flow cannot continue, saying which and what to do."""
    rid, name = run.run_id, run.pipeline
    if name != program.name:
        raise ResumeError(f"run {rid} is a run of '{name}', not of '{program.name}'; resume it with the flow "
                          f"'{name}' that recorded it")
    if run.status not in RESUMABLE + ("running",):  # a running one is refused by the claim, which says who has it
        last_ok = max((s.step for s in run.steps if s.status == "ok"), default=0)
        what = {"ok": "it finished (status ok): nothing waits for an answer",
                "failed": f"it failed ({run.error}): a failed run is not continued"}.get(
            run.status, f"its status is {run.status!r}")
        raise ResumeError(f"run {rid} of '{name}' is not paused or interrupted: {what}. To try again from one of "
                          f"its steps, fork it: flow.fork('{rid}', after_step={last_ok}, store=store)")
    if run.pipeline_hash != program.hash:
        last_ok = max((s.step for s in run.steps if s.status == "ok"), default=0)
        raise ResumeError(
            f"run {rid} was recorded by '{name}' version {run.pipeline_hash}, but this flow is version "
            f"{program.hash} (its stages or their code changed since): resuming would mix two versions in one "
            f"run. Resume it with the flow that paused it, or fork it into this version: "
            f"flow.fork('{rid}', after_step={last_ok}, store=store)")


def _claim(run: Run, store: Any) -> str:
    """Mark the run as being resumed here, atomically: a second resumer is refused. Returns its status
    before (what `_release` gives back)."""
    status = run.status
    if store is None:  # a run at hand, recorded nowhere: the object is the claim
        if status not in RESUMABLE:
            raise ResumeError(f"run {run.run_id} cannot be resumed twice at once: it is running (status "
                              f"{status}); wait until it pauses or ends, then resume it again if it asks")
        run.status = "running"
        return status
    if store.read_only:
        raise ResumeError(f"{store.path} is open read-only; open Store('{store.path}') to resume run {run.run_id}")
    won, before, pid, host = store.claim_run(run.run_id, len(run.steps))
    if won and status == "running":  # it was running when loaded and has stopped since: look again
        store.release_run(run.run_id, "interrupted")
        before = "changed"
    elif won:
        before = status
    if before == "changed":
        raise ResumeError(f"run {run.run_id} was resumed by someone else since it was loaded (the store holds "
                          f"more of it now); load it again (pass its id) and resume it if it still asks")
    if before == "missing":
        raise ResumeError(f"run {run.run_id} is not in {store.path}; resume it with the store it was recorded in")
    if not won:
        raise ResumeError(f"run {run.run_id} cannot be resumed twice at once: process {pid} on {host} is running it "
                          f"(status {before}: resuming it, or on its first go); wait until it pauses or ends, then "
                          f"resume it again if it asks")
    run.status = "running"
    return before


def _resumed(run: Run) -> tuple[Any, ...]:
    """The run carries on: how much of its record there was (its earlier spans: the last item, to link to)."""
    mark = (len(run.steps), len(run.reads), len(run.writes), len(run.decisions),
            {t: len(rows) for t, rows in run.rows.items()}, (run.trace_id, run.span_id) if run.trace_id else None)
    run.trace_id = run.span_id = None
    run.error, run.pending, run.resume_at, run.ended_at = None, None, None, None
    return mark


def resume_execution(program: Program, target: Union[Run, str], answer: Any = NO_ANSWER, *, store: Any = None,
                     by: Optional[str] = None, env: Optional[Mapping[str, Any]] = None,
                     listeners: Sequence[Listener] = (), replay: bool = False, child: bool = False,
                     live_effects: bool = False) -> Execution:
    """An Execution that continues a paused or interrupted run where it stopped (see the module doc)."""
    run = _load(target, store, "resume")
    if run.parent_run_id is not None and not child:
        raise ResumeError(f"run {run.run_id} is a subflow of run {run.parent_run_id}; resume that run (the parent), "
                          f"which resumes this one with it")
    _check(program, run)
    if run.status == "running":  # refused by the claim, which says who has it
        _claim(run, store)
    pos = locate(program, run, start=_fork_start(program, run, store or run.store))
    given = answer is not NO_ANSWER
    if given:
        json_text(answer)
        _check_answer(program, run, answer, store)
    asked = run.status == "paused" or pos.paused is not None
    if not asked and given:
        raise ResumeError(f"run {run.run_id} was interrupted, not paused: nothing asked for an answer; resume it "
                          f"without one (it continues after step {pos.last})")
    at = program.ins[pos.pc] if pos.pc < len(program.ins) else None
    if run.status == "paused" and (at is None or (run.resume_at or {}).get("stage") not in (None, at.id)):
        raise ResumeError(f"run {run.run_id} paused at stage '{(run.resume_at or {}).get('stage')}', but its record "
                          f"leads this flow to {at.id if at else 'its end'!r}; resume it with the flow that paused it")
    status = _claim(run, store)
    try:
        start = _start_of(program, run, pos, store, replay, live_effects)
        child_id = _paused_child(run, pos, at)
        if child_id is not None and at is not None:
            known = next((c for c in run.children if c.run_id == child_id), None)
            start.resume_child = (str(at.id), resume_execution(
                at.node.flow.program, known or child_id, answer if asked else NO_ANSWER, store=store, by=by, env=env,
                listeners=listeners, replay=replay, child=True, live_effects=live_effects))
        elif asked:
            start.deliver = _delivery(run, pos, at, Answer(new_id(), answer, by, run.pending, time.time_ns(),
                                                           pos.paused.step if pos.paused else None) if given else None)
            start.gate = pos.pc if pos.paused is None else -1  # a pause_before point: answered, the stage begins
    except BaseException:
        _release(run, store, status)
        raise
    start.resumed = _resumed(run)
    return Runner(program, None, env=env, store=store, subject=run.subject, listeners=listeners, start=start)


def _start_of(program: Program, run: Run, pos: "Position", store: Any, replay: bool, live_effects: bool) -> StartPoint:
    """Where a resumed run carries on: its scope, step numbers, loops, and the record it replays from."""
    data, last = scope_at(program, run, None)
    start = StartPoint(run=run, data=data, last_write=last, args=initial_scope(program, run), pc=pos.pc,
                       next_step=max((s.step for s in run.steps), default=0), counts=dict(pos.counts), loops=pos.loops,
                       effects=EffectPolicy(live=live_effects))
    if replay:  # any call whose exact request this run (or its subflows) recorded, in recorded order
        start.replay = ReplayBook.of_run(run)
    if run.kind in ("replay", "counterfactual") and store is not None:  # it goes on replaying its source
        source, after = store.run(run.forked_from_run_id), run.forked_from_step or 0
        start.replay = start.replay or ReplayBook.of_run(source, after, consumed=run.rows.get("model_calls", ()))
        start.effects = EffectPolicy((EffectBook.of_run(source, after, consumed=run.rows.get("effects", ())),),
                                     strict=True, live=live_effects)
    return start


def _paused_child(run: Run, pos: "Position", at: Any) -> Optional[str]:
    """The subflow run that continues with this one: the child that paused, or the one a crash interrupted."""
    paused = pos.paused
    if paused is not None and paused.kind == "subflow":
        return paused.child_run_id
    if paused is None and at is not None and at.op == "subflow":
        late = [c for c in run.children if c.status == "interrupted" and (c.parent_step or 0) > pos.last]
        return late[-1].run_id if late else None
    return None


def _delivery(run: Run, pos: "Position", at: Any, answer: Optional[Answer]) -> Delivery:
    """What the stage a resumed run re-enters gets: the answers so far (and the new one), and the model calls
    and effects its paused steps made, to answer from the record."""
    paused = pos.paused
    stage = paused.stage if paused is not None else str(at.id if at is not None else "")
    earlier = [Answer.from_row(r) for r in run.rows.get("human_inputs", ())
               if paused is not None and r["step"] == paused.step] + ([answer] if answer is not None else [])
    asked_before = [r for r in run.rows.get("model_calls", ()) if r["step"] in pos.group]
    made_before = [r for r in run.rows.get("effects", ()) if r["step"] in pos.group]
    return Delivery(stage, earlier, ReplayBook(asked_before) if asked_before else None,
                    EffectBook(made_before) if made_before else None, (run.resume_at or {}).get("item"))


def _fork_start(program: Program, run: Run, store: Any) -> Optional["Position"]:
    """Where a fork began in the program: its source run's place after the step it was forked after
    (None for a run that is not a fork)."""
    if run.forked_from_run_id is None:
        return None
    if store is None:
        raise ResumeError(f"run {run.run_id} is a fork of run {run.forked_from_run_id}; resuming it needs store=... "
                          f"(where both are recorded) to find where it began")
    try:
        source = store.run(run.forked_from_run_id)
    except RunNotFoundError as gone:
        raise ResumeError(f"run {run.run_id} is a fork of run {run.forked_from_run_id}, so continuing it needs that "
                          f"run's record to find where the fork began in the flow: {gone}") from None
    start = locate(program, source, run.forked_from_step, start=_fork_start(program, source, store))
    start.loops.last_decision.clear()  # as fork_execution began it: those decisions are the source's steps
    return start


def _check_answer(program: Program, run: Run, answer: Any, store: Any) -> None:
    """Refuse an answer that does not fit what the pause expects, before anything is claimed or committed
    (a pause inside a subflow: what the child's pause expects)."""
    at = run.resume_at or {}
    while at.get("kind") == "subflow" and at.get("child_run_id"):
        child = next((c for c in run.children if c.run_id == at["child_run_id"]), None)
        if child is None and store is None:
            return
        index = program.ids.get(at.get("stage"))
        if index is not None and program.ins[index].op == "subflow":
            program = program.ins[index].node.flow.program
        run = child if child is not None else store.run(at["child_run_id"])
        at = run.resume_at or {}
    if at.get("expect"):
        asker = next((s for s in program.specs if s.id == at.get("stage")), None)
        check_answer(at["expect"], answer, run.pending, f"run {run.run_id} (paused at stage '{at.get('stage')}')",
                     home=getattr(asker.fn, "__module__", None) if asker is not None else None)


def _release(run: Run, store: Any, status: str) -> None:
    """Undo a claim when the resume could not start."""
    run.status = status
    if store is not None:
        store.release_run(run.run_id, status)


def fork_execution(program: Program, target: Union[Run, str], after_step: Union[int, str], *,
                   edits: Optional[Mapping[str, Any]] = None, store: Any = None,
                   env: Optional[Mapping[str, Any]] = None, listeners: Sequence[Listener] = (),
                   replay: bool = False, subject: Optional[str] = None, without: Iterable[str] = (),
                   counterfactual: Optional[dict[str, Any]] = None, live_effects: bool = False) -> Execution:
    """An Execution of a new run that starts from `target`'s state after `after_step` (0: its start),
    with `edits` applied as its first step (see the module doc); `without` names sources the new run
    leaves out ("memory:m_…", "run:…", "section:KIND:ID"; see StageContext.without)."""
    source = _load(target, store, "fork")
    if source.pipeline != program.name:
        raise ResumeError(f"run {source.run_id} is a run of '{source.pipeline}', not of '{program.name}'; fork "
                          f"it with that flow")
    after = _step_number(source, after_step)
    pos = locate(program, source, after, start=_fork_start(program, source, store or source.store))
    data, _ = scope_at(program, source, after)
    edit = _edit_spec(program, data, dict(edits or {}))
    salt = store.salt if store is not None else PROCESS_SALT
    run = Run(run_id=new_id(), pipeline=program.name, pipeline_hash=program.hash, schema=program.schema,
              input_json=program.schema.dump_scope(data, salt), started_at=time.time_ns(),
              subject=subject or source.subject)
    run.store, run.tools = store, program.tools
    run.forked_from_run_id, run.forked_from_step = source.run_id, after
    run.without, run.counterfactual = frozenset(str(w) for w in without), counterfactual
    run.kind = "counterfactual" if counterfactual is not None else "replay" if replay else "fork"
    pos.loops.last_decision.clear()  # the decisions that routed here are steps of the original run
    start = StartPoint(run=run, data=data, args=dict(data), pc=pos.pc, counts=dict(pos.counts), loops=pos.loops,
                       prelude=edit, effects=EffectPolicy(live=live_effects))
    if replay:  # model calls and side effects answered from the record; an effect it lacks is not made
        start.replay = ReplayBook.of_run(source, after)
        start.effects = EffectPolicy((EffectBook.of_run(source, after),), strict=True, live=live_effects)
    return Runner(program, None, env=env, store=store, subject=run.subject, listeners=listeners, start=start)


def _step_number(run: Run, ref: Union[int, str]) -> int:
    if ref == 0:
        return 0
    try:
        return run.step(ref).step
    except TracememError:
        shown = [f"{s.step}:{s.stage}" for s in run.steps]
        if len(shown) > 12:
            shown = shown[:5] + ["…"] + shown[-5:]
        raise ResumeError(f"run {run.run_id} has no step {ref!r} to fork after; its steps: " + ", ".join(shown)
                          + " (0: from its start)") from None


def _edit_spec(program: Program, data: dict[str, Any], edits: dict[str, Any]) -> Optional[StageSpec]:
    """The fork's first step, which writes the edits; each is tried first, so a bad one is refused
    before the fork begins."""
    if not edits:
        return None

    def edit(scope: Any) -> None:
        for path, value in edits.items():
            write_path(scope, path, "set", value)

    trial = StepRecorder(RunState(program.schema, dict(data), b""), 1, "(edit)")
    for path, value in edits.items():
        try:
            write_path(new_view(program.view_class, trial), path, "set", value)
        except ScopeWriteError as err:
            raise ResumeError(f"fork edit {path} = {value!r} is invalid: {err.reason}") from None
        except (PathError, ScopeReadError, KeyError, IndexError, AttributeError, TypeError) as err:
            raise ResumeError(f"fork edit {path!r} does not name a value of the scope "
                              f"{program.scope.__name__}: {err}") from None
    return StageSpec(id="(edit)", name="edit", fn=edit, description="the edits a fork starts with", kind="edit")
