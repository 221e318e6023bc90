"""Walking a run's record backwards into a `Trace`: the breadth-first walker and `backtrack`.

The walker turns reads, writes and decisions into the nodes and edges of a
trace, and asks `sources` for what lies beyond the scope (model calls, prompt
sections, memories, past runs). The runs it enters, other runs read through the
loader the run was recorded with (`run.store`), come from `WalkedRuns`
(walked_runs.py); a list element's write is found by `element_write`
(list_elements.py). A fork (`flow.fork`) started from another run's state: what it
read from that state is traced into the original run, to the write that set it
before the fork point.
"""
from __future__ import annotations

import json
from collections import deque
from typing import Any, Iterable, Optional

from ..errors import PathError, UsageError
from ..record import Read, RunRecord, Write
from ..scope.paths import parse_path, root_of
from . import sources
from .index import RunIndex
from .list_elements import element_write
from .trace import Trace
from .walked_runs import WalkedRuns


class Walker:
    """Breadth-first walk adding nodes and edges, across runs when a store is at hand (`runs`)."""

    def __init__(self, trace: "Trace", max_depth: int, max_nodes: int, cross_runs: bool,
                 index: Optional[Any] = None) -> None:
        self.trace = trace
        self.g = trace.graph
        self.max_depth = max_depth
        self.max_nodes = max_nodes
        self.queue: deque[tuple[str, int, RunIndex, Any]] = deque()
        self.runs = WalkedRuns(index if index is not None else RunIndex(trace.run), trace.run.store, cross_runs)
        self.element_root: Optional[str] = None  # the traced list element's write: no compose edge needed
        self.provenance = "turn"  # under a memory: "turn" (the user's words, the extractor's reply) or "step"

    def pruned_run(self, run_id: str, depth: int, via: str) -> str:
        """A node for a run the walk cannot enter: it says why."""
        node = f"run:{run_id}"
        self.add(node, depth, None, None, kind="run", run_id=run_id, via=via, missing=self.runs.gone(run_id))
        return node

    def add(self, node: str, depth: int, idx: Optional[RunIndex], item: Any, **attrs: Any) -> bool:
        """Add a node (once) and queue it for expansion; False when the node budget is spent."""
        if node in self.g:
            return True
        if self.g.number_of_nodes() >= self.max_nodes:
            self.trace.truncated = True
            return False
        self.g.add_node(node, **attrs)
        if depth >= self.max_depth:
            if item is not None:
                self.trace.truncated = True
            return True
        if item is not None:
            self.queue.append((node, depth, idx, item))
        return True

    def link(self, parent: str, child: str, kind: str) -> None:
        if child in self.g and parent in self.g:
            self.g.add_edge(parent, child, kind=kind)

    def write_node(self, idx: RunIndex, w: Write, depth: int) -> str:
        node = idx.node_write(w)
        step = idx.steps[w.step]
        run = idx.run
        edit = {"edit": f"fork of run {str(run.forked_from_run_id)[:8]} after step {run.forked_from_step}"} \
            if step.kind == "edit" else {}
        self.add(node, depth, idx, ("write", w), kind="write", run_id=run.run_id, step=w.step, seq=w.seq,
                 path=w.path, verb=w.verb, value=w.value, stage=step.stage, child_run_id=step.child_run_id, **edit)
        return node

    def origin(self, idx: RunIndex, path: str, depth: int) -> str:
        """Where a value read as run input came from: the input, or — for a run that
        resumed an earlier one — the last write of it earlier in the thread."""
        field = root_of(path)
        while True:  # a fork's starting state: set in the original run before the fork point (a loop: forks of forks)
            forked = idx.run.forked_from_run_id
            source = self.runs.index(forked) if forked else None
            if source is None:
                break
            before = source.last_upto(field, idx.run.forked_from_step or 0)
            if before is not None:
                return self.write_node(source, before, depth)
            idx = source
        if not idx.run.continues or field in idx.given:
            return self.input_node(idx, path, depth)
        thread = self.runs.thread(idx, field)
        for run_id, inputs, first, writes, live in reversed(thread[:-1]):
            owner = self.runs.index(run_id, live)
            if writes and owner is not None:
                return self.write_node(owner, writes[-1], depth)
            if first or field in inputs:
                return self.input_node(owner or idx, path, depth)
        gone = self.runs.continued_gone(thread)
        if gone is not None:  # the thread's earlier turns are not in the store: say so, never guess
            return self.pruned_run(gone, depth, "thread")
        return self.input_node(idx, path, depth)

    def input_node(self, idx: RunIndex, path: str, depth: int) -> str:
        node = f"in:{idx.run.run_id}:{path}"
        self.add(node, depth, idx, None, kind="input", run_id=idx.run.run_id, path=path,
                 value=idx.inputs.get(root_of(path)))
        return node

    def step_node(self, idx: RunIndex, step: int, depth: int, turn_only: bool = False) -> str:
        """A whole step as a source (its reads and routing). `turn_only` (the step that extracted a memory):
        only the reads that carried the user's turn are followed, not the model replies it also read."""
        node = f"s:{idx.run.run_id}:{step}"
        s = idx.steps.get(step)
        self.add(node, depth, idx, ("turn" if turn_only else "step", step), kind="step", run_id=idx.run.run_id,
                 step=step, stage=s.stage if s else "?")
        return node

    def read_sources(self, node: str, idx: RunIndex, reads: Iterable[Read], depth: int) -> None:
        for r in reads:
            if r.source_step is None:
                child = self.origin(idx, r.path, depth + 1)
            else:
                w = idx.writes.get((r.source_step, r.source_seq))
                if w is None:
                    continue
                child = self.write_node(idx, w, depth + 1)
            self.link(node, child, "data")

    def control(self, node: str, idx: RunIndex, step: int, depth: int) -> None:
        s = idx.steps.get(step)
        if s is None or s.routed_by is None:
            return
        d = idx.decisions.get(s.routed_by)
        if d is None:
            return
        decider = idx.steps[s.routed_by]
        child = f"d:{idx.run.run_id}:{d.step}"
        self.add(child, depth + 1, idx, ("decision", d.step), kind="decision", run_id=idx.run.run_id, step=d.step,
                 stage=decider.stage, chosen=d.chosen, evidence=d.evidence)
        self.link(node, child, "control")

    def into_subflow(self, node: str, idx: RunIndex, w: Write, depth: int) -> None:
        """A value a subflow step wrote came from the child run's output field it was mapped from."""
        step = idx.steps[w.step]
        child_id = step.child_run_id
        child_run = next((c for c in idx.run.children if c.run_id == child_id), None)
        child = self.runs.index(child_id, child_run)  # type: ignore[arg-type]
        link = next(iter(idx.rows("subflows", w.step)), None)
        outputs = json.loads(link["outputs"]) if link and link.get("outputs") else {}
        source_field = outputs.get(root_of(w.path))
        if child is None or source_field is None:
            target = f"run:{child_id}"
            if self.add(target, depth + 1, None, None, kind="run", run_id=child_id, via="subflow"):
                self.link(node, target, "subflow")
            return
        source = child.last_write(source_field)
        target = self.write_node(child, source, depth + 1) if source is not None else \
            self.origin(child, source_field, depth + 1)
        self.link(node, target, "subflow")

    def expand(self, node: str, depth: int, idx: RunIndex, item: Any) -> None:
        what = item[0]
        if what == "write":
            w: Write = item[1]
            self.read_sources(node, idx, (r for r in idx.reads.get(w.step, ()) if r.seq < w.seq), depth)
            whole_element = node == self.element_root and (w.verb == "append" or (
                w.verb == "set" and len(parse_path(w.path)) == 2))
            if not whole_element and (w.verb != "set" or "." in w.path or "[" in w.path):
                earlier = idx.previous(w)
                if earlier is not None:
                    self.link(node, self.write_node(idx, earlier, depth + 1), "compose")
                else:
                    self.link(node, self.origin(idx, str(parse_path(w.path)[0]), depth + 1), "compose")
            self.control(node, idx, w.step, depth)
            if idx.steps[w.step].child_run_id:
                self.into_subflow(node, idx, w, depth)
            sources.step_sources(self, idx, w.step, node, depth)
        elif what in ("decision", "step", "turn"):
            step = item[1]
            reads = idx.reads.get(step, ())
            if what == "turn":  # what explains a memory is the turn it came from, not the assistant's reply
                reads = [r for r in reads if not idx.model_output(r)]
            self.read_sources(node, idx, reads, depth)
            self.control(node, idx, step, depth)
            # a decider's too: a model or a human chose
            sources.step_sources(self, idx, step, node, depth, turn_only=what == "turn")
        elif callable(what):
            what(self, node, depth, idx, *item[1:])

    def walk(self) -> None:
        while self.queue:
            node, depth, idx, item = self.queue.popleft()
            self.expand(node, depth, idx, item)


def scope_fields(run: "RunRecord", written: Optional[list[str]] = None) -> Optional[list[str]]:
    """The fields of the run's scope: from its schema when known, else from the recorded paths (the
    starting scope and the writes' fields, or `written` when given); None when neither can tell (a resumed
    run of an unknown scope)."""
    if run.schema is not None:
        return list(run.schema.fields)
    if run.continues:
        return None
    fields = list(json.loads(run.input_json) if run.input_json else {})
    for root in written if written is not None else (root_of(w.path) for w in run.writes):
        if root not in fields:
            fields.append(root)
    return fields


def backtrack(run: "RunRecord", path: str, *, max_depth: int = 64, max_nodes: int = 2000,
              cross_runs: bool = True, index: Optional[Any] = None, provenance: str = "turn") -> Trace:
    """Build the Trace of the last write of `path` in `run` (see `tracemem.trace.trace`). A path whose field
    the scope does not have is an error listing the fields (a field it has but never wrote is `missing`).
    `index`: how to look the run up (a `StoredIndex` for a run loaded without its steps; a `RunIndex` of it
    by default). `provenance`: under a memory, "turn" follows the user's words and the extractor's reply
    only; "step" everything the extracting step read (the assistant's reply included)."""
    if provenance not in ("turn", "step"):
        raise UsageError(f"backtrack(provenance=...) is 'turn' (the user's words) or 'step' (all the extracting "
                         f"step read), got {provenance!r}")
    written = index.fields() if index is not None else None
    field, fields = parse_path(path)[0], scope_fields(run, written)  # parse_path: a malformed path is a PathError
    if fields is not None and field not in fields:
        raise PathError(f"'{path}': run {run.run_id} of '{run.pipeline}' has no field '{field}'; "
                        f"its fields: {', '.join(fields)}")
    trace = Trace(run, path)
    walker = Walker(trace, max_depth, max_nodes, cross_runs, index)
    walker.provenance = provenance
    idx = walker.runs.indexes[run.run_id]
    wanted = parse_path(path)
    if len(wanted) >= 2 and isinstance(wanted[1], int):  # a list element: the write that produced it
        thread = walker.runs.thread(idx, str(wanted[0]))
        gone = walker.runs.continued_gone(thread) if wanted[1] >= 0 and str(wanted[0]) not in thread[0].inputs else None
        if gone is not None:  # counted from the start of a list whose first turns were pruned
            trace.missing = "pruned"
            trace.root = walker.pruned_run(gone, 0, "thread")
            return trace
        found = element_write(walker.runs, idx, str(wanted[0]), wanted[1])
        if found is not None:
            owner, produced = found
            if produced is None:
                trace.missing = "never-written"
                trace.root = walker.input_node(owner, path, 0)
                return trace
            trace.root = walker.element_root = owner.node_write(produced)
            walker.write_node(owner, produced, 0)
            walker.walk()
            return trace
    target = idx.last_write(path)
    if target is None and run.forked_from_run_id and walker.runs.index(run.forked_from_run_id) is not None:
        root = walker.origin(idx, path, 0)  # set before the fork point: traced in the original run
        if walker.g.nodes[root].get("kind") == "write":
            trace.root = root
            walker.walk()
            return trace
    if target is None:
        trace.missing = "never-written"
        trace.root = walker.input_node(idx, path, 0)
        return trace
    trace.root = walker.write_node(idx, target, 0)
    walker.walk()
    return trace
