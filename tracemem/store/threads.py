"""Thread states: what `resume=<run id>` starts from, without replaying the thread each turn.

A conversation served over HTTP continues each turn by run id, so each turn would
read every earlier turn's writes back from the file and replay them. Instead the
store keeps, for the runs most recently recorded or resumed through it, the state
that replay gives, built incrementally: a run's state is the state of the run it
continued plus its own input and committed writes, applied exactly as
`replay_thread` applies them (so the answer is the one a full replay gives). The
states of runs that were continued are kept too (a thread may branch), within a
bound; anything older, evicted or recorded by another process is replayed from
the file once and kept from then on.
"""
from __future__ import annotations

import copy
import json
import threading
from collections import OrderedDict
from typing import Any, Callable, NamedTuple, Optional, Sequence

from ..dbmeta import first_row
from ..errors import RunNotFoundError, TracememError
from ..record import Step, ThreadRun, Write, value_chars
from ..run import Run
from ..scope.known import known_scopes
from ..scope.paths import root_of
from ..scope.replay import replay_thread
from .load import thread
from .log_codec import records
from .retention import pruned_at


class Ended(NamedTuple):
    """What a recorded run adds to the state of the run it continued (its values by reference: no copies)."""

    continues: Optional[str]
    thread_id: Optional[str]
    pipeline: str
    schema: Any
    input_json: str
    writes: tuple  # its committed writes' fields as plain tuples (see backlog.queued: kept for 256 runs, Write
    #                NamedTuples would be walked by every garbage collection meanwhile); or, for a run whose
    #                journal entries hold its records, those entries, decoded only if its state is asked for


_STATUS, _STEP = Step._fields.index("status"), Write._fields.index("step")


def committed(steps: Sequence[Sequence[Any]], writes: Sequence[Sequence[Any]]) -> tuple[tuple, ...]:
    """A run's writes outside failed steps, as a tuple of plain tuples (`Write` fields): neither is tracked
    by the garbage collector once it has looked at them."""
    if all(s[_STATUS] == "ok" for s in steps):
        return writes if type(writes) is tuple else tuple(map(tuple, writes))  # (the backlog's copy: as such)
    failed = {s[_STEP] for s in steps if s[_STATUS] != "ok"}
    return tuple(tuple(w) for w in writes if w[_STEP] not in failed)


def _committed_writes(kept: tuple) -> list[Write]:
    """The writes an `Ended` keeps, as `Write`s: from their fields, or the committed ones among those the run's
    journal entries hold (decoded now)."""
    if kept and type(kept[0]) is bytes:
        steps, _, writes = records(kept)
        kept = committed(steps, writes)
    return list(map(Write._make, kept))


class Known(NamedTuple):
    """A run's final state, as replay gives it (JSON data; never changed once made)."""

    pipeline: str
    thread_id: Optional[str]
    schema: Any
    data: dict[str, Any]


def advance(base: dict[str, Any], inputs: dict[str, Any], writes: list[Write],
            reset: Callable[[str], Any]) -> dict[str, Any]:
    """The state after a run that started from `base` with recorded `inputs` and made `writes`, leaving
    `base` (which other states share) unchanged: a field the run changes in place is copied first —
    shallowly when only whole-field verbs touch it (appends to a list), else deeply."""
    start = dict(base)
    touched: dict[str, bool] = {}  # field → changed only at its top level
    for w in writes:
        root = root_of(w.path)
        touched[root] = touched.get(root, True) and w.path == root
    for root, shallow in touched.items():
        if root in start and root not in inputs:
            start[root] = copy.copy(start[root]) if shallow else copy.deepcopy(start[root])
    return replay_thread([ThreadRun("", inputs, False, writes)], reset, start=start)


class ThreadStates:
    """Final states of the runs recorded (and resumed) through one store most recently, bounded: at most
    `runs` recorded runs whose writes hold at most `held` characters of values, and `states` states."""

    def __init__(self, runs: int = 256, held: int = 32_000_000, states: int = 64) -> None:
        self.lock = threading.Lock()
        self.max_runs, self.max_held, self.max_states = runs, held, states
        self.held = 0
        self.ended: OrderedDict[str, tuple[Ended, int]] = OrderedDict()
        self.states: OrderedDict[str, Known] = OrderedDict()

    def recorded(self, run: Run) -> None:
        """A run ended in this store (the store's sink calls this; its values are kept, not copied)."""
        writes: tuple = run.entries or committed(run.raw_steps, run.raw_writes)
        entry = Ended(run.continues, run.thread_id, run.pipeline, run.schema, run.input_json, writes)
        size = sum(map(len, writes)) if run.entries else value_chars(writes)
        with self.lock:
            self.ended[run.run_id] = (entry, size)
            self.held += size
            while self.ended and (len(self.ended) > self.max_runs or self.held > self.max_held):
                self.held -= self.ended.popitem(last=False)[1][1]

    def known(self, run_id: str) -> Optional[Known]:
        """The run's final state if it can be had without reading the file: kept, or one step on from
        the kept state of the run it continued."""
        with self.lock:
            hit = self.states.get(run_id)
            if hit is not None:
                self.states.move_to_end(run_id)
                return hit
            held = self.ended.get(run_id)
            if held is None:
                return None
            e = held[0]
            base = {} if e.continues is None else self.states.get(e.continues)
            if base is None:
                return None
        writes = _committed_writes(e.writes)
        reset = e.schema.default if e.schema else (lambda name: None)
        data = advance(base if isinstance(base, dict) else base.data, json.loads(e.input_json), writes, reset)
        return self.keep(run_id, Known(e.pipeline, e.thread_id, e.schema, data))

    def keep(self, run_id: str, known: Known) -> Known:
        with self.lock:
            self.states[run_id] = known
            if len(self.states) > self.max_states:
                self.states.popitem(last=False)
        return known

    def clear(self) -> None:
        """Forget everything (after a prune: the file no longer holds what may be kept here)."""
        with self.lock:
            self.ended.clear()
            self.states.clear()
            self.held = 0


def handout(known: Known) -> Any:
    """The state as a new run starts from it: the scope model (or data, when the model is unknown), sharing
    nothing mutable with the kept state that validation would pass through."""
    schema = known.schema
    if schema is None:
        return copy.deepcopy(known.data)
    data = {k: v if k not in schema.field_set or schema.rebuilt(k) else copy.deepcopy(v)
            for k, v in known.data.items()}
    return schema.rebuild(data)


def replayed(con: Any, run_id: str, path: str) -> Known:
    """A run's final state replayed from the file (its thread read in one go)."""
    head = first_row(con.execute("SELECT pipeline, pipeline_hash, thread_id FROM runs WHERE run_id = ?", [run_id]))
    if head is None:
        raise RunNotFoundError(f"no run '{run_id}' in {path}; list runs with `tracemem runs` or store.runs()")
    runs = thread(con, run_id)
    if not runs[0].first:
        raise TracememError(broken_thread(con, run_id, runs[0].run_id))
    schema = known_scopes.find(head[1], head[0])
    return Known(head[0], head[2], schema, replay_thread(runs, schema.default if schema else (lambda name: None)))


def broken_thread(con: Any, run_id: str, oldest: str) -> str:
    """Why a thread's state cannot be rebuilt: its oldest run here continues one that is gone."""
    row = first_row(con.execute("SELECT continues_run_id FROM runs WHERE run_id = ?", [oldest]))
    gone = row[0] if row else "?"
    when = pruned_at(con, gone)
    why = f"was pruned on {when:%Y-%m-%d %H:%M:%S} (prune(force=True))" if when else "is not in the store"
    return (f"run {run_id} cannot be replayed: its thread continues run {gone}, which {why}; the turns "
            f"before it are gone, so the thread's state is unknown")
