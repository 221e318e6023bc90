"""The in-memory record of one run: plain tuples, cheap to build on the hot path.

These are exactly the rows the store writes (`steps`, `reads`, `writes`,
`decisions`), so a run loaded back from DuckDB is the same object as a live one.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional


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
    verb: str  # set | append | delete
    value: Optional[str]


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
    kind: str  # stage | decider | fork-branch | subflow | loop
    iteration: int
    status: str  # ok | failed
    error: Optional[str]
    started_at: int  # ns since epoch
    ended_at: int
    routed_by: Optional[int]  # the decision step that routed execution here
    child_run_id: Optional[str] = None
    logs: tuple[str, ...] = ()


RUN_INPUT = None  # the source of a read whose value came from the run input
