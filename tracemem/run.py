"""A recorded run: what the runner returns and what `store.run(id)` loads back.

Everything here works from the recorded rows alone (the initial scope and the
write log), so a live run and one read back from DuckDB answer identically.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Optional, Union


from .errors import TracememError
from .paths import apply_write, parse_path
from .record import Decision, Read, Step, Write
from .schema import ScopeSchema

if TYPE_CHECKING:
    from .trace import Trace


class Run:
    """One pipeline run: steps, reads, writes, decisions, extra rows, and the final scope."""

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
        self.ended_at: Optional[int] = None
        self.status = "running"
        self.error: Optional[str] = None
        self._output: Any = None
        self.output_json: Optional[str] = None  # runs.output: see ScopeSchema.dump_output
        self.steps: list[Step] = []
        self.reads: list[Read] = []
        self.writes: list[Write] = []
        self.decisions: list[Decision] = []
        self.rows: dict[str, list[dict[str, Any]]] = {}
        self.children: list["Run"] = []
        self.query: Optional[str] = None
        self.trace_id: Optional[str] = None
        self.continues: Optional[str] = None  # the run whose final state this run started from
        self._previous: Optional["Run"] = None
        self._journal: Optional[str] = None  # "stage"/"run": journaled by the store, moved to the tables later
        # durability "stage": how much of the record has reached the tables, and how much is complete
        # (counts of steps, reads, writes, decisions, and extra rows per table)
        self._written: Optional[tuple] = None
        self._mark: Optional[tuple] = None
        self._flow: Any = None  # the live Flow (for sinks needing stage facts, e.g. OTel tool spans)
        self.store: Any = None  # the Store it was recorded into, for cross-run backtracking

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

    def previous(self) -> Optional["Run"]:
        """The run this one continued (`flow.run(..., resume=...)`), loaded on demand."""
        if self.continues and self._previous is None:
            if self.store is None:
                raise TracememError(f"run {self.run_id} continues run {self.continues}, which is not at hand; "
                                    f"load it through the store it was recorded in")
            self._previous = self.store.run(self.continues)
        return self._previous

    # -- replay -------------------------------------------------------------------
    def _replay(self, upto: Optional[int]) -> dict[str, Any]:
        """Replay the thread this run ends, oldest run first (iteratively: threads can be long).
        Runs of the thread not loaded are replayed in bulk from the store."""
        chain, run, data = [self], self, {}
        while run.continues:
            if run._previous is None:
                if self.store is None:
                    raise TracememError(f"run {run.run_id} continues run {run.continues}, which is not at hand; "
                                        f"load it through the store it was recorded in")
                data = self.store._final_state(run.continues)
                break
            run = run._previous
            chain.append(run)
        reset = self.schema.default if self.schema else (lambda name: None)
        for run in reversed(chain):
            data = {**data, **json.loads(run.input_json)}
            failed = {s.step for s in run.steps if s.status != "ok"}
            limit = upto if run is self else None
            for w in run.writes:
                if limit is not None and w.step > limit:
                    break
                if w.step not in failed:
                    apply_write(data, parse_path(w.path), w.verb, None if w.value is None else json.loads(w.value),
                                reset)
        return data

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

    # -- backtracking ---------------------------------------------------------------
    def backtrack(self, path: str, *, max_depth: int = 64, max_nodes: int = 2000,
                  cross_runs: bool = True) -> "Trace":
        """The causal graph of the last write of `path`: see `tracemem.trace`."""
        from .trace import backtrack

        return backtrack(self, path, max_depth=max_depth, max_nodes=max_nodes, cross_runs=cross_runs)
