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
from typing import TYPE_CHECKING, Any, Generic, Optional, Sequence, TypeVar, Union, overload

from .errors import RunNotFoundError, TracememError
from .record import Decision, Read, ResumePoint, RunLoader, Step, ThreadRun, Write, built
from .scope.paths import parse_path, root_of
from .scope.diff import Change, diff_values
from .scope.replay import replay_thread
from .scope.schema import ScopeSchema

LEAVES_NOTHING_OUT: frozenset[str] = frozenset()
"""A run's `without` when it leaves nothing out: one shared empty set (each `frozenset()` is a new object the
garbage collector tracks)."""

if TYPE_CHECKING:
    from .trace.trace import Trace

R = TypeVar("R", Step, Read, Write)


class Records(Generic[R]):
    """`Run.steps`, `Run.reads`, `Run.writes`: the run's records as `kind` NamedTuples, though the runner appends
    plain field tuples (to `raw_steps`, `raw_reads`, `raw_writes`). Reading the attribute names those appended
    since it was last read, in place (a tuple of records, as the store writer's copy holds them, becomes a list
    first); setting it sets the raw list. Why: building a NamedTuple and freeing it costs ~1,700 instructions
    against ~360 for a tuple, four times a stage, and most recorded runs are only ever written to the store,
    which takes plain tuples."""

    def __init__(self, kind: type[R]) -> None:
        self.kind = kind

    def __set_name__(self, owner: type, name: str) -> None:
        self.raw, self.done = f"raw_{name}", f"named_{name}"

    @overload
    def __get__(self, run: None, owner: type) -> "Records[R]": ...

    @overload
    def __get__(self, run: "Run", owner: type) -> list[R]: ...

    def __get__(self, run: Optional["Run"], owner: type) -> Union["Records[R]", list[R]]:
        if run is None:
            return self
        raw, start = getattr(run, self.raw), getattr(run, self.done)
        end = len(raw)  # (records another thread appends meanwhile are named by the next read)
        if start != end:
            if type(raw) is not list:
                raw = list(raw)
                setattr(run, self.raw, raw)
            kind = self.kind
            raw[start:end] = [r if type(r) is kind else built(kind, r) for r in raw[start:end]]
            setattr(run, self.done, end)
        return raw

    def __set__(self, run: "Run", value: Union[list[Any], tuple[Any, ...]]) -> None:
        setattr(run, self.raw, value)
        setattr(run, self.done, 0)


class Run:
    """One pipeline run: steps, reads, writes, decisions, extra rows, and the final scope."""

    # Facts most runs never change, as class defaults: a run is built once per `flow.run`, and each attribute
    # set in `__init__` is work on that path. An assignment gives the run its own value.
    ended_at: Optional[int] = None
    status = "running"
    error: Optional[str] = None
    degraded: Optional[str] = None  # why a run that ends ok did less than it should (ctx.degrade)
    _output: Any = None
    output_json: Optional[str] = None  # runs.output: see ScopeSchema.dump_output
    query: Optional[str] = None
    trace_id: Optional[str] = None
    continues: Optional[str] = None  # the run whose final state this run started from
    thread_id: Optional[str] = None  # the first run of the thread it continues (None: it continues none)
    store: Optional[RunLoader] = None  # the store it was recorded into, for cross-run reading
    pending: Any = None  # a paused run: what it asks (the `ctx.interrupt` payload)
    resume_at: Optional[dict[str, Any]] = None  # a paused run: the stage it continues at, and how
    forked_from_run_id: Optional[str] = None  # a fork (`flow.fork`): the run and step it started from
    forked_from_step: Optional[int] = None
    span_id: Optional[str] = None  # its OpenTelemetry run span (of its latest stretch)
    without: frozenset[str] = LEAVES_NOTHING_OUT  # sources ("kind:id") a counterfactual run leaves out
    counterfactual: Optional[dict[str, Any]] = None  # what a counterfactual run tests (JSON-able)
    kind = "run"  # "run", or how it was started from another: "fork", "replay" (a replaying fork), "counterfactual"
    resumed_from: Optional[tuple[Any, ...]] = None  # resuming: how much of its record the store holds
    entries: tuple[bytes, ...] = ()  # the store writer's copy of a journaled run: the journal entries
    # that hold its steps, reads and writes in their place (store/backlog.queued)
    named_steps = named_reads = named_writes = 0  # how many of raw_steps, raw_reads, raw_writes are named (Records)
    steps = Records(Step)
    reads = Records(Read)
    writes = Records(Write)
    _previous: Optional["Run"] = None  # the run it continues, held: nothing else could load it
    _previous_ref: Optional["weakref.ref[Run]"] = None  # ... or, recorded in the same store, not held

    def __init__(self, *, run_id: str, pipeline: str, pipeline_hash: str, schema: Optional[ScopeSchema],
                 input_json: str, started_at: int, subject: Optional[str] = None,
                 parent_run_id: Optional[str] = None, parent_step: Optional[int] = None) -> None:
        self.run_id = run_id
        self.pipeline = pipeline
        self.pipeline_hash = pipeline_hash
        self.schema = schema
        self.input_json = input_json
        self.subject = subject
        self.parent_run_id = parent_run_id
        self.parent_step = parent_step
        self.started_at = started_at
        # its records as the runner makes them: plain field tuples (`steps`, `reads`, `writes` name them)
        self.raw_steps: list[Any] = []
        self.raw_reads: list[Any] = []  # (the store writer's copy of a run holds tuples: store/backlog.queued)
        self.raw_writes: list[Any] = []
        self.decisions: list[Decision] = []
        self.rows: dict[str, list[dict[str, Any]]] = {}
        self.children: list["Run"] = []
        self.notes: list[str] = []  # what tracemem had to change, or could not store, of this run (runs.notes)
        self.tools: dict[str, Optional[str]] = {}  # stage id → description, for stages marked tool=True
        self.links: list[tuple[str, str]] = []  # resuming: (trace id, span id) of its spans before the pause

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
    def paused(self) -> bool:
        """True when the run waits for an answer (`run.pending` says what it asks; `flow.resume` answers)."""
        return self.status == "paused"

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

    def set_records(self, steps: Sequence[Any], reads: Sequence[Any], writes: Sequence[Any]) -> None:
        """Set `steps`, `reads` and `writes` at once, as setting each does (`Records.__set__`), in one call: the
        store writer's copy of every run is made this way (store/backlog.queued)."""
        self.raw_steps, self.raw_reads, self.raw_writes = steps, reads, writes
        self.named_steps = self.named_reads = self.named_writes = 0

    # -- threads ------------------------------------------------------------------
    def continue_from(self, previous: Union["Run", ResumePoint]) -> None:
        """Mark this run as continuing `previous` (the runner does this for `resume=`). A run recorded in
        this run's store is not kept alive by it (it is read back from the store when needed, so a long
        thread's runs never hold each other); any other run is, being the only record of itself."""
        self.continues = previous.run_id
        self.thread_id = previous.thread_id or previous.run_id
        if isinstance(previous, Run):
            if self.store is not None and previous.store is self.store:
                self._previous_ref = weakref.ref(previous)
            else:
                self._previous = previous
                if previous.output_json is not None:  # its final state is this run's start now: kept once, not
                    previous._output = None  # per run (`previous.output` replays it on demand), so a thread
                    #                          held in memory grows with its turns, not their square

    def _held(self) -> Optional["Run"]:
        """The run this one continued, when it is at hand (held, or still alive)."""
        if self._previous is None and self._previous_ref is not None:
            return self._previous_ref()
        return self._previous

    def previous(self) -> Optional["Run"]:
        """The run this one continued (`flow.run(..., resume=...)`), loaded on demand."""
        held = self._held()
        if self.continues and held is None:
            held = self._previous = self._loader().run(self.continues)
        return held

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
        while run.continues:
            held = run._held()
            if held is None:
                break
            run = held
            chain.append(run)
        older: list[ThreadRun] = []
        if run.continues and load:
            try:
                older = self._loader().thread(run.continues, root)
            except RunNotFoundError:  # the run it continues is gone (pruned): here the thread starts later
                older = []
        return older + [ThreadRun(r.run_id, json.loads(r.input_json), not r.continues, r.committed_writes(root), r)
                        for r in reversed(chain)]

    def _loader(self) -> RunLoader:
        if self.store is None:
            raise TracememError(f"run {self.run_id} continues run {self.continues}, which is not at hand; "
                                f"load it through the store it was recorded in")
        return self.store

    # -- replay -------------------------------------------------------------------
    def _replay(self, upto: Optional[int]) -> dict[str, Any]:
        reset = self.schema.default if self.schema else (lambda name: None)
        thread = self.thread()
        if not thread[0].first:  # its earliest turns were pruned (prune(force=True)): say so, never guess
            raise TracememError(self._loader().broken_thread(self.run_id, thread[0].run_id))
        return replay_thread(thread, reset, upto)

    def state_at(self, step: Union[int, str, None] = None) -> Any:
        """The scope as it was after `step` (a number or stage id; None = the end), by replaying writes."""
        upto = None if step is None else self.step(step).step
        data = self._replay(upto)
        return self.schema.rebuild(data) if self.schema else data

    def value_at(self, path: str, step: Union[int, str, None] = None) -> Any:
        """One path's value after `step` (None = the end)."""
        upto = None if step is None else self.step(step).step
        value: Any = self._replay(upto)
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


def _final(run: Run) -> Any:
    """A run's final scope as JSON data (secrets redacted alike on both sides)."""
    state = run.state_at()
    return json.loads(state.model_dump_json()) if hasattr(state, "model_dump_json") else state
