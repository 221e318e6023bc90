"""The in-memory record of one run: values, built once and read by name.

`Step`, `Read`, `Write` and `Decision` are exactly the rows the store writes
(`steps`, `reads`, `writes`, `decisions`), in the same column order, so a run loaded
back from DuckDB holds the same values as a live one.
`RunLoader` is what readers of a run (replay, backtracking) may ask of the store
the run was recorded in, so they never reach into the store itself; `RunRecord` is what
they read of the run (`tracemem.run.Run` is one), so that they need not import run.py,
which imports them.
"""
from __future__ import annotations

from typing import Any, Iterable, Literal, NamedTuple, Optional, Protocol, Sequence, Union

EXTRA_TABLES = frozenset({"effects", "human_inputs", "memory_uses", "model_calls", "prompt_sections", "prompts",
                          "run_embeddings", "snapshot_uses", "subflows", "tool_calls", "messages", "message_chains",
                          "tool_sets"})
"""The tables a step's extra rows may go to (`ctx.emit`); store/write/rows.py gives their columns (a test checks it has
these and the five record tables, no more). Named here, not there, so that a flow refuses an unknown table without
importing the store (and Arrow)."""

Verb = Literal["set", "append", "delete"]
# map-item: one element of a `Pipeline.map` fan-out; tool: the same, marked tool=True (one tool call);
# edit: a fork's edits
StepKind = Literal["stage", "decider", "fork-branch", "subflow", "loop", "edit", "map-item", "tool"]
StepStatus = Literal["ok", "failed", "paused"]  # paused: the stage asked a human (ctx.interrupt)


class Read(NamedTuple):
    """A scope read; `source_step`/`source_seq` name the write it saw (None = run input)."""

    step: int
    seq: int
    path: str
    source_step: Optional[int]
    source_seq: Optional[int]


class Write(NamedTuple):
    """A scope write; `value` is JSON text serialized at write time (secrets redacted)."""

    step: int
    seq: int
    path: str
    verb: Verb
    value: Optional[str]


def value_chars(writes: Iterable[Write]) -> int:
    """The characters of the JSON values some writes hold."""
    return sum(len(w.value) for w in writes if w.value)


class Decision(NamedTuple):
    """A routing decision: the branch chosen and the evidence for it."""

    step: int
    chosen: str
    evidence: Any  # JSON-able


class Step(NamedTuple):
    """One stage execution."""

    step: int
    stage: str  # stable stage id
    name: str
    kind: StepKind
    iteration: int
    status: StepStatus
    error: Optional[str]
    started_at: int  # ns since epoch
    ended_at: int
    routed_by: Optional[int]  # the decision step that routed execution here
    child_run_id: Optional[str] = None
    logs: tuple[str, ...] = ()


class ThreadRun(NamedTuple):
    """One run of a conversation thread as replay and backtracking need it."""

    run_id: str
    inputs: dict[str, Any]  # its recorded input (the whole starting scope for the thread's first run)
    first: bool  # whether it starts the thread
    writes: list[Write]  # its writes (to one field, when asked for one), failed steps left out
    run: Optional["RunRecord"] = None  # the live Run, when at hand (else it is loaded from the store on demand)


class ResumePoint(NamedTuple):
    """What `resume=<run id>` continues (`Store.resume_point`): the run's id, pipeline, thread and final
    state, without its record (`store.run(id)` loads that)."""

    run_id: str
    pipeline: str
    thread_id: Optional[str]
    schema: Any  # its ScopeSchema, None when the scope model is unknown
    output: Any  # its final scope: the pydantic model (or the data, when the model is unknown)

    def state_at(self) -> Any:
        """The final scope (as `Run.state_at()` gives it)."""
        return self.output


class RunLoader(Protocol):
    """What readers of a run may ask of the store it was recorded in (`tracemem.store.Store`)."""

    def run(self, run_id: str) -> "RunRecord": ...

    def runs_by_id(self, run_ids: list[str]) -> dict[str, "RunRecord"]: ...

    def thread(self, run_id: str, root: Optional[str] = None) -> list[ThreadRun]: ...

    def suspect(self, run_ids: Iterable[str]) -> dict[str, str]: ...

    def pruned_at(self, run_id: str) -> Optional[Any]: ...

    def broken_thread(self, run_id: str, oldest: str) -> str: ...


class RunRecord(Protocol):
    """What replay and backtracking read of a run: its record, where it started from, and the store that
    can load the runs it points to. `tracemem.run.Run` is the one implementation."""

    run_id: str
    pipeline: str
    schema: Any
    input_json: str
    continues: Optional[str]
    forked_from_run_id: Optional[str]
    forked_from_step: Optional[int]
    steps: Sequence[Step]
    reads: Sequence[Read]
    writes: Sequence[Write]
    decisions: Sequence[Decision]
    rows: dict[str, list[dict[str, Any]]]
    children: Sequence["RunRecord"]
    store: Optional[RunLoader]

    def thread(self, root: Optional[str] = None, *, load: bool = True) -> list[ThreadRun]: ...

    def value_at(self, path: str, step: Union[int, str, None] = None) -> Any: ...
