"""A recorded run: what the runner returns and what `store.run(id)` loads back.

Everything here works from the recorded rows alone (the initial scope and the
write log), so a live run and one read back from DuckDB answer identically.
A run that continued an earlier one (`resume=`) is the last of a thread: its
state is the replay of the whole thread, from live runs where they are at hand
and from the store it was recorded in for the rest.
"""
from __future__ import annotations

import json
import weakref
from typing import TYPE_CHECKING, Any, Optional, Union

from .errors import RunNotFoundError, TracememError
from .record import Decision, Read, ResumePoint, RunLoader, Step, ThreadRun, Write
from .scope.paths import parse_path, root_of
from .scope.diff import Change, diff_values
from .scope.replay import replay_thread
from .scope.schema import ScopeSchema

if TYPE_CHECKING:
    from .trace.trace import Trace


class Previous:
    """The run a run continues (`resume=`): held when it is the only record of itself, else weakly (one
    recorded in the same store is read back from it when gone), so a long thread's runs never hold each
    other and a thread held in memory grows with its turns, not their square."""

    def __init__(self, run: Union["Run", ResumePoint], store: Optional[RunLoader]) -> None:
        self.run_id = run.run_id
        self._held: Optional[Run] = None
        self._ref: Optional["weakref.ref[Run]"] = None
        if isinstance(run, Run):
            if store is not None and run.store is store:
                self._ref = weakref.ref(run)
            else:
                self._held = run
                if run.output_json is not None:  # its final state is the next run's start now: kept once
                    run.output = None  # (`run.output` replays it on demand)

    def at_hand(self) -> Optional["Run"]:
        """The run, when it is held or still alive (None: load it from the store)."""
        return self._held if self._held is not None or self._ref is None else self._ref()

    def load(self, store: Optional[RunLoader]) -> "Run":
        """The run, at hand or loaded from `store` (then held)."""
        run = self.at_hand()
        if run is None:
            if store is None:
                raise TracememError(f"run {self.run_id} is not at hand; load it through the store it was recorded "
                                    f"in")
            run = self._held = store.run(self.run_id)  # type: ignore[assignment]
        return run  # type: ignore[return-value]


class Run:
    """One pipeline run: its steps, reads, writes, decisions and extra rows (records, built once), the facts
    of its `runs` row, and the final scope."""

    def __init__(self, *, run_id: str, pipeline: str, pipeline_hash: str, schema: Optional[ScopeSchema],
                 input_json: str, started_at: int, subject: Optional[str] = None,
                 parent_run_id: Optional[str] = None, parent_step: Optional[int] = None) -> None:
        self.run_id, self.pipeline, self.pipeline_hash, self.schema = run_id, pipeline, pipeline_hash, schema
        self.input_json, self.started_at, self.subject = input_json, started_at, subject
        self.parent_run_id, self.parent_step = parent_run_id, parent_step
        self.steps: list[Step] = []
        self.reads: list[Read] = []
        self.writes: list[Write] = []
        self.decisions: list[Decision] = []
        self.rows: dict[str, list[dict[str, Any]]] = {}
        self.children: list["Run"] = []
        # the facts of its `runs` row (besides the above)
        self.status, self.error, self.ended_at = "running", None, None
        self.output_json: Optional[str] = None  # runs.output: see ScopeSchema.dump_output
        self.degraded: Optional[str] = None  # why a run that ended ok did less than it should (ctx.degrade)
        self.query: Optional[str] = None
        self.notes: list[str] = []  # what tracemem had to change, or could not store, of this run (runs.notes)
        self.pending: Any = None  # a paused run: what it asks (the `ctx.interrupt` payload)
        self.resume_at: Optional[dict[str, Any]] = None  # a paused run: the stage it continues at, and how
        self.kind = "run"  # or how it started from another run: "fork", "replay" (a replaying fork), "counterfactual"
        self.forked_from_run_id: Optional[str] = None  # a fork (`flow.fork`): the run and step it started from
        self.forked_from_step: Optional[int] = None
        self.counterfactual: Optional[dict[str, Any]] = None  # what a counterfactual run tests (JSON-able)
        self.without: frozenset[str] = frozenset()  # sources ("kind:id") a counterfactual run leaves out
        self.continues: Optional[str] = None  # the run whose final state this run started from
        self.thread_id: Optional[str] = None  # the first run of the thread it continues (None: it continues none)
        self.trace_id: Optional[str] = None  # its OpenTelemetry trace and run span (of its latest stretch),
        self.span_id: Optional[str] = None  # annotated by the OpenTelemetry listener
        self.tools: dict[str, Optional[str]] = {}  # stage id → description, for stages marked tool=True
        self.store: Optional[RunLoader] = None  # the store it was recorded into, for cross-run reading
        self._output: Any = None
        self._previous: Optional[Previous] = None

    def __repr__(self) -> str:
        return f"<Run {self.run_id} {self.pipeline} {self.status} steps={len(self.steps)}>"

    @property
    def output(self) -> Any:
        """The final scope (the pydantic model; a dict if the model is unknown), rebuilt by replay if needed."""
        if self._output is None and self.output_json is not None:
            self._output = self.state_at()
        return self._output

    @output.setter
    def output(self, value: Any) -> None:
        self._output = value

    @property
    def ok(self) -> bool:
        """True when the run finished without error."""
        return self.status == "ok"

    @property
    def input(self) -> dict[str, Any]:
        """The starting scope (run input plus defaults) as JSON data."""
        return json.loads(self.input_json)

    def step(self, ref: Union[int, str]) -> Step:
        """A step by number, or the last execution of a stage id."""
        if isinstance(ref, int):
            for s in self.steps:
                if s.step == ref:
                    return s
        else:
            for s in reversed(self.steps):
                if s.stage == ref:
                    return s
        raise TracememError(f"run {self.run_id} has no step {ref!r}; steps: "
                            + ", ".join(f"{s.step}:{s.stage}" for s in self.steps))

    # -- threads ------------------------------------------------------------------
    def continue_from(self, previous: Union["Run", ResumePoint]) -> None:
        """Mark this run as continuing `previous` (the runner does this for `resume=`)."""
        self.continues = previous.run_id
        self.thread_id = previous.thread_id or previous.run_id
        self._previous = Previous(previous, self.store)

    def previous(self) -> Optional["Run"]:
        """The run this one continued (`flow.run(..., resume=...)`), loaded on demand."""
        return self._previous.load(self.store) if self._previous is not None else (
            self.store.run(self.continues) if self.continues and self.store is not None else None)  # type: ignore[return-value]

    def committed_writes(self, root: Optional[str] = None) -> list[Write]:
        """Writes of the steps that finished (a failed step's writes were never committed), optionally
        only those touching top-level field `root`."""
        failed = {s.step for s in self.steps if s.status != "ok"}
        return [w for w in self.writes if w.step not in failed and (root is None or root_of(w.path) == root)]

    def thread(self, root: Optional[str] = None, *, load: bool = True) -> list[ThreadRun]:
        """The thread this run ends, oldest first, with each run's committed writes (to `root` only, when
        given): live runs where at hand, the rest from the store in one load (`load=False`: only the
        runs at hand)."""
        chain, run = [self], self
        while run.continues and run._previous is not None and (held := run._previous.at_hand()) is not None:
            run = held
            chain.append(run)
        older: list[ThreadRun] = []
        if run.continues and load:
            try:
                older = _loader(self).thread(run.continues, root)
            except RunNotFoundError:  # the run it continues is gone (pruned): here the thread starts later
                older = []
        return older + [ThreadRun(r.run_id, json.loads(r.input_json), not r.continues, r.committed_writes(root), r)
                        for r in reversed(chain)]

    # -- replay -------------------------------------------------------------------
    def state_at(self, step: Union[int, str, None] = None) -> Any:
        """The scope as it was after `step` (a number or stage id; None = the end), by replaying writes."""
        upto = None if step is None else self.step(step).step
        data = _replayed(self, upto)
        return self.schema.rebuild(data) if self.schema else data

    def value_at(self, path: str, step: Union[int, str, None] = None) -> Any:
        """One path's value after `step` (None = the end)."""
        upto = None if step is None else self.step(step).step
        value: Any = _replayed(self, upto)
        for key in parse_path(path):
            try:
                value = value[key]
            except (KeyError, IndexError, TypeError):
                raise TracememError(f"run {self.run_id} has no value at '{path}' after step {step}") from None
        return value

    def diff(self, other: "Run") -> list[Change]:
        """The paths whose final values differ between this run and `other` (e.g. a fork and its
        original), each as `Change(path, ours, theirs)`; a path one side lacks has `MISSING` there."""
        return diff_values(_final(self), _final(other))

    # -- backtracking ---------------------------------------------------------------
    def backtrack(self, path: str, *, max_depth: int = 64, max_nodes: int = 2000,
                  cross_runs: bool = True, provenance: str = "turn") -> "Trace":
        """The causal graph of the last write of `path`: see `tracemem.trace`. Under a memory it follows the
        user's words and the extractor's reply (`provenance="step"`: all the extracting step read)."""
        from .trace.walk import backtrack

        return backtrack(self, path, max_depth=max_depth, max_nodes=max_nodes, cross_runs=cross_runs,
                         provenance=provenance)


def _loader(run: Run) -> RunLoader:
    if run.store is None:
        raise TracememError(f"run {run.run_id} continues run {run.continues}, which is not at hand; "
                            f"load it through the store it was recorded in")
    return run.store


def _replayed(run: Run, upto: Optional[int]) -> dict[str, Any]:
    """The scope after step `upto` (None: the end), replayed from the whole thread's writes."""
    reset = run.schema.default if run.schema else (lambda name: None)
    thread = run.thread()
    if not thread[0].first:  # its earliest turns were pruned (prune(force=True)): say so, never guess
        raise TracememError(_loader(run).broken_thread(run.run_id, thread[0].run_id))
    return replay_thread(thread, reset, upto)


def _final(run: Run) -> Any:
    """A run's final scope as JSON data (secrets redacted alike on both sides)."""
    state = run.state_at()
    return json.loads(state.model_dump_json()) if hasattr(state, "model_dump_json") else state
