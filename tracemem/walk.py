"""Walking a run's record backwards: the index over one run, and the breadth-first walker
that turns reads, writes and decisions (and, through hooks, model calls, prompt sections
and memories) into the nodes and edges of a `Trace`, across runs when a store is at hand."""
from __future__ import annotations

import json
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional

from .paths import parse_path, root_of
from .record import Read, Write

if TYPE_CHECKING:
    from .run import Run
    from .trace import Trace

# Extensions add edges from a step to things outside the scope (see tracemem.sources).
SourceHook = Callable[["Walker", "RunIndex", int, str, int], None]
SOURCE_HOOKS: list[SourceHook] = []


class RunIndex:
    """Lookups over one run's record used while walking it."""

    def __init__(self, run: "Run") -> None:
        self.run = run
        failed = {s.step for s in run.steps if s.status != "ok"}
        self.steps = {s.step: s for s in run.steps}
        self.reads: dict[int, list[Read]] = {}
        for r in run.reads:
            self.reads.setdefault(r.step, []).append(r)
        self.writes: dict[tuple[int, int], Write] = {}
        self.by_root: dict[str, list[Write]] = {}
        for w in run.writes:
            if w.step in failed:
                continue
            self.writes[(w.step, w.seq)] = w
            self.by_root.setdefault(parse_path(w.path)[0], []).append(w)
        self.position = {(w.step, w.seq): i for ws in self.by_root.values() for i, w in enumerate(ws)}
        self.decisions = {d.step: d for d in run.decisions}
        self.inputs: dict[str, Any] = json.loads(run.input_json) if run.input_json else {}
        self.given = set(self.inputs) if run.continues else set()

    def node_write(self, w: Write) -> str:
        return f"w:{self.run.run_id}:{w.step}:{w.seq}"

    def last_write(self, path: str) -> Optional[Write]:
        wanted = parse_path(path)
        for w in reversed(self.by_root.get(wanted[0], [])):
            p = parse_path(w.path)
            n = min(len(p), len(wanted))
            if p[:n] == wanted[:n]:
                return w
        return None


class Walker:
    """Breadth-first walk adding nodes and edges, across runs when a store is at hand."""

    def __init__(self, trace: "Trace", max_depth: int, max_nodes: int, cross_runs: bool) -> None:
        self.trace = trace
        self.g = trace.graph
        self.max_depth = max_depth
        self.max_nodes = max_nodes
        self.cross_runs = cross_runs
        self.queue: deque[tuple[str, int, RunIndex, Any]] = deque()
        self.indexes: dict[str, RunIndex] = {trace.run_id: RunIndex(trace.run)}
        self.store = trace.run.store
        self.element_root: Optional[str] = None  # the traced list element's write: no compose edge needed

    def index(self, run_id: str, live: Optional["Run"] = None) -> Optional[RunIndex]:
        if run_id not in self.indexes and live is not None:
            self.indexes[run_id] = RunIndex(live)
        if run_id not in self.indexes:
            if self.store is None or not self.cross_runs:
                return None
            try:
                self.indexes[run_id] = RunIndex(self.store.run(run_id))
            except Exception:
                return None
        return self.indexes[run_id]

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
        self.add(node, depth, idx, ("write", w), kind="write", run_id=idx.run.run_id, step=w.step, seq=w.seq,
                 path=w.path, verb=w.verb, value=w.value, stage=step.stage, child_run_id=step.child_run_id)
        return node

    def origin(self, idx: RunIndex, path: str, depth: int) -> str:
        """Where a value read as run input came from: the input, or — for a run that
        resumed an earlier one — the last write of it earlier in the thread."""
        field = root_of(path)
        if not idx.run.continues or field in idx.given:
            return self.input_node(idx, path, depth)
        for run_id, inputs, first, writes, live in reversed(self.thread(idx, field)[:-1]):
            if writes:
                return self.write_node(self.index(run_id, live), writes[-1], depth)  # type: ignore[arg-type]
            if first or field in inputs:
                owner = self.index(run_id, live)
                return self.input_node(owner, path, depth) if owner else self.input_node(idx, path, depth)
        return self.input_node(idx, path, depth)

    def thread(self, idx: RunIndex, root: str) -> list[tuple[str, dict[str, Any], bool, list[Write], Any]]:
        """The runs of the thread `idx` ends, oldest first: (run id, its recorded input, whether it starts
        the thread, its writes touching `root`, the live Run or None). Runs not at hand come from the
        store in two queries, however long the thread."""
        out: list[tuple[str, dict[str, Any], bool, list[Write], Any]] = []
        run: Any = idx.run
        while True:
            failed = {s.step for s in run.steps if s.status != "ok"}
            writes = [w for w in run.writes if w.step not in failed and root_of(w.path) == root]
            out.append((run.run_id, json.loads(run.input_json), not run.continues, writes, run))
            if not run.continues:
                break
            if run._previous is None:
                if self.store is None or not self.cross_runs:
                    break
                out.extend(reversed([(rid, inputs, first, writes, None) for rid, inputs, first, writes
                                     in self.store._thread(run.continues, root)]))
                break
            run = run._previous
        return out[::-1]

    def element_write(self, idx: RunIndex, root: str, index: int) -> tuple[RunIndex, Optional[Write]]:
        """Which write produced element `index` of list field `root` (following appends, item sets and
        deletes in order, back through the thread); (run, None) when it came from a run's input."""
        producers: list[tuple[str, Any, Optional[Write]]] = []  # (run id, live run, write or None = input)
        for run_id, inputs, first, writes, live in self.thread(idx, root):
            if first or root in inputs:
                value = inputs.get(root)
                if not isinstance(value, list):
                    raise LookupError(root)
                producers = [(run_id, live, None)] * len(value)
            for w in writes:
                path = parse_path(w.path)
                if len(path) == 1:
                    if w.verb == "append":
                        producers.append((run_id, live, w))
                    else:
                        value = json.loads(w.value) if w.value else []
                        producers = [(run_id, live, w)] * (len(value) if isinstance(value, list) else 0)
                elif isinstance(path[1], int):
                    if len(path) == 2 and w.verb == "delete":
                        del producers[path[1]]
                    else:
                        producers[path[1]] = (run_id, live, w)
        if not -len(producers) <= index < len(producers):
            raise LookupError(index)
        run_id, live, produced = producers[index]
        owner = self.index(run_id, live)
        if owner is None:
            raise LookupError(run_id)
        return owner, produced

    def input_node(self, idx: RunIndex, path: str, depth: int) -> str:
        node = f"in:{idx.run.run_id}:{path}"
        self.add(node, depth, idx, None, kind="input", run_id=idx.run.run_id, path=path,
                 value=idx.inputs.get(root_of(path)))
        return node

    def step_node(self, idx: RunIndex, step: int, depth: int) -> str:
        """A whole step as a source (its reads and routing), e.g. the step that extracted a memory."""
        node = f"s:{idx.run.run_id}:{step}"
        s = idx.steps.get(step)
        self.add(node, depth, idx, ("step", step), kind="step", run_id=idx.run.run_id, step=step,
                 stage=s.stage if s else "?")
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
        child = self.index(child_id, child_run)  # type: ignore[arg-type]
        flow = idx.run._flow or (getattr(self.store, "_flows", {}) or {}).get(idx.run.pipeline_hash)
        outputs = next((i.node.outputs for i in flow.program.ins if i.op == "subflow" and i.id == step.stage),
                       None) if flow is not None else None
        if outputs is None:  # recorded by the runner: "subflow outputs {json}"
            line = next((entry for entry in step.logs if entry.startswith("subflow outputs ")), None)
            outputs = json.loads(line[len("subflow outputs "):]) if line else None
        source_field = (outputs or {}).get(parse_path(w.path)[0])
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
                root = parse_path(w.path)[0]
                pos = idx.position[(w.step, w.seq)]
                if pos > 0:
                    self.link(node, self.write_node(idx, idx.by_root[root][pos - 1], depth + 1), "compose")
                else:
                    self.link(node, self.origin(idx, root, depth + 1), "compose")
            self.control(node, idx, w.step, depth)
            if idx.steps[w.step].child_run_id:
                self.into_subflow(node, idx, w, depth)
            for hook in SOURCE_HOOKS:
                hook(self, idx, w.step, node, depth)  # type: ignore[call-arg]
        elif what in ("decision", "step"):
            step = item[1]
            self.read_sources(node, idx, idx.reads.get(step, ()), depth)
            self.control(node, idx, step, depth)
            if what == "step":
                for hook in SOURCE_HOOKS:
                    hook(self, idx, step, node, depth)  # type: ignore[call-arg]
        elif callable(what):
            what(self, node, depth, idx, *item[1:])

    def walk(self) -> None:
        while self.queue:
            node, depth, idx, item = self.queue.popleft()
            self.expand(node, depth, idx, item)
