"""Compiling a pipeline declaration into a jump program, its graph, and validating both.

The runner executes `Program.ins` with a program counter; the same structure
yields the `networkx.DiGraph` users inspect, and the control regions (branch
arms, loops) that tell which decision routed each step. The program also holds
what running needs of the scope: its schema and the view class stages receive.
"""
from __future__ import annotations

import functools
import hashlib
import json
import inspect
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Optional

import networkx as nx

from ..errors import PipelineError
from ..scope.known import known_scopes
from ..scope.schema import ScopeSchema
from ..scope.recorder import ScopeView, view_class
from .fork import BranchPool
from .interrupt import mentions_interrupt
from .spec import BranchNode, Declaration, ForkNode, LoopNode, MapNode, Node, StageNode, StageSpec, SubflowNode


Op = Literal["stage", "branch", "fork", "subflow", "loop", "jump", "map"]

START, END = "__start__", "__end__"


@dataclass(frozen=True)
class Region:
    """Instructions [start, end] entered by one decision: a branch arm or a loop body."""

    key: Any  # branch index, or ("loop", owner index)
    start: int
    end: int
    exit: int = -1  # loops: where break_loop continues
    max_iterations: int = 0
    name: str = ""


@dataclass
class Instruction:
    """One instruction of the jump program (a node of the declaration, or a jump)."""

    op: Op
    id: Optional[str] = None
    spec: Optional[StageSpec] = None
    node: Any = None
    targets: dict[str, int] = field(default_factory=dict)
    arm_ranges: dict[str, tuple[int, int]] = field(default_factory=dict)
    after: int = -1
    target: int = -1
    branch_index: int = -1  # loop with when=<branch key>: the branch it follows
    loop_keys: frozenset = frozenset()  # branch: keys whose arm jumps backwards
    regions: tuple[Region, ...] = ()
    plain: bool = False  # a stage the runner calls directly (`StageSpec.plain`, no pause before it): its hot path


class Program:
    """The compiled, validated form of a `Pipeline`."""

    def __init__(self, pipeline: Declaration) -> None:
        self.pipeline = pipeline
        self.ins: list[Instruction] = []
        self.ids: dict[str, int] = {}
        self.fork_branch_ids: set[str] = set()
        self.specs: list[StageSpec] = []
        self._gotos: list[tuple[int, str, str]] = []
        self._last_branch = -1  # the index of the branch a loop_to(when=<key>) follows
        self._emit(pipeline.nodes)
        if not self.ins:
            raise PipelineError(f"pipeline '{pipeline.name}' has no stages; add one with .then(fn)")
        self._resolve()
        self._add_regions()
        self.graph = self._graph()
        self._validate()
        self.name = pipeline.name
        self.scope = pipeline.scope
        self.query = self._query()
        self.max_iterations = pipeline.max_iterations
        self.schema = ScopeSchema(pipeline.scope)
        self.view_class: type[ScopeView] = view_class(self.schema)
        self.hash = self.fingerprint()
        self.tools = {s.id: s.description for s in self.specs if s.tool}  # stage id → description
        self.pool = BranchPool()  # the threads its fork branches and map steps run in (flow/fork.py)
        self.has_async = any(s.is_async for s in self.specs) or any(
            i.op == "loop" and callable(i.node.when) and inspect.iscoroutinefunction(i.node.when)
            for i in self.ins)
        known_scopes.add(self.hash, self.schema)

    # -- compile ------------------------------------------------------------------
    def _register(self, spec_id: str, index: Optional[int], spec: Optional[StageSpec] = None) -> None:
        if spec_id in self.ids or spec_id in self.fork_branch_ids:
            raise PipelineError(
                f"duplicate stage id '{spec_id}' in pipeline '{self.pipeline.name}'; "
                f"give one of them a different id: .then(fn, id='...')"
            )
        if index is None:
            self.fork_branch_ids.add(spec_id)
        else:
            self.ids[spec_id] = index
        if spec is not None:
            self.specs.append(spec)

    def _emit(self, nodes: list[Node]) -> None:
        previous: Any = None
        for node in nodes:
            at = len(self.ins)
            if isinstance(node, StageNode):
                self._register(node.spec.id, at, node.spec)
                self.ins.append(Instruction("stage", node.spec.id, node.spec,
                                            plain=node.spec.plain and not node.spec.pause_before))
            elif isinstance(node, BranchNode):
                self._emit_branch(node, at)
            elif isinstance(node, ForkNode):
                self._register(node.id, at)
                for spec in node.branches:
                    if mentions_interrupt(spec.fn):
                        raise PipelineError(
                            f"fork '{node.id}': branch '{spec.id}' calls ctx.interrupt(), but fork branches run "
                            f"together and commit together, so one cannot pause alone; ask in a stage before or "
                            f"after the fork (.then(ask).fork(...))")
                    self._register(spec.id, None, spec)
                self.ins.append(Instruction("fork", node.id, node=node))
            elif isinstance(node, SubflowNode):
                self._register(node.spec.id, at, node.spec)
                self.ins.append(Instruction("subflow", node.spec.id, node.spec, node=node))
            elif isinstance(node, MapNode):  # (a map's step may pause: the whole map pauses, flow/parallel.py)
                self._register(node.spec.id, at, node.spec)
                self.ins.append(Instruction("map", node.spec.id, node.spec, node=node))
            elif isinstance(node, LoopNode):
                self._register(node.id, at)
                ins = Instruction("loop", node.id, node=node)
                if isinstance(node.when, str):
                    if not (isinstance(previous, BranchNode) and node.when in previous.arms):
                        raise PipelineError(
                            f"pipeline '{self.pipeline.name}': loop_to('{node.target}', when='{node.when}') must "
                            f"directly follow a .branch(...) that has an arm '{node.when}'"
                        )
                    ins.branch_index = self._last_branch
                elif not callable(node.when):
                    raise PipelineError(f"loop '{node.id}': when= must be a branch key or fn(scope) -> bool")
                self.ins.append(ins)
            previous = node

    def _emit_branch(self, node: BranchNode, at: int) -> None:
        self._register(node.decider.id, at, node.decider)
        branch = Instruction("branch", node.decider.id, node.decider, node=node)
        self.ins.append(branch)
        jumps = []
        for key, arm in node.arms.items():
            if isinstance(arm, str):
                self._gotos.append((at, key, arm))
                continue
            start = len(self.ins)
            branch.targets[key] = start
            self._emit(arm)
            jump = Instruction("jump")
            self.ins.append(jump)
            jumps.append(jump)
            branch.arm_ranges[key] = (start, len(self.ins) - 1)
        branch.after = len(self.ins)
        for jump in jumps:
            jump.target = branch.after
        self._last_branch = at

    def _resolve(self) -> None:
        known = ", ".join(self.ids)
        for at, key, target in self._gotos:
            branch = self.ins[at]
            if target not in self.ids:
                hint = " (it is a fork branch; jump to the fork instead)" if target in self.fork_branch_ids else ""
                raise PipelineError(
                    f"branch '{branch.id}' arm '{key}' targets unknown stage '{target}'{hint}; known stages: {known}"
                )
            branch.targets[key] = self.ids[target]
            if self.ids[target] <= at:
                branch.loop_keys = branch.loop_keys | {key}
        for ins in self.ins:
            if ins.op == "loop":
                node: LoopNode = ins.node
                if node.target not in self.ids:
                    raise PipelineError(f"loop '{node.id}' targets unknown stage '{node.target}'; known stages: {known}")
                ins.target = self.ids[node.target]
                if ins.target > self.ids[node.id]:
                    raise PipelineError(f"loop '{node.id}' must jump back to an earlier stage, not '{node.target}'")

    def _add_regions(self) -> None:
        regions: list[Region] = []
        for i, ins in enumerate(self.ins):
            if ins.op == "branch":
                for start, end in ins.arm_ranges.values():
                    regions.append(Region(i, start, end))
                for key in ins.loop_keys:
                    regions.append(Region(("loop", i), ins.targets[key], i, ins.after,
                                          self.pipeline.max_iterations, f"{ins.id}→{key}"))
            elif ins.op == "loop":
                regions.append(Region(("loop", i), ins.target, i, i + 1, ins.node.max_iterations, ins.id or ""))
        for i, ins in enumerate(self.ins):
            ins.regions = tuple(r for r in regions if r.start <= i <= r.end)

    # -- graph ----------------------------------------------------------------------
    def node_at(self, index: int) -> str:
        """The graph node an instruction index leads to (jumps followed)."""
        seen = set()
        while index < len(self.ins) and self.ins[index].op == "jump":
            if index in seen:
                break
            seen.add(index)
            index = self.ins[index].target
        return END if index >= len(self.ins) else str(self.ins[index].id)

    def _graph(self) -> nx.DiGraph:
        g = nx.DiGraph(name=self.pipeline.name)
        g.add_node(START, kind="start", name=START)
        g.add_node(END, kind="end", name=END)
        g.add_edge(START, self.node_at(0), label=None)
        for i, ins in enumerate(self.ins):
            if ins.op == "jump":
                continue
            kind = {"stage": "stage", "branch": "decider"}.get(ins.op, ins.op)
            spec = ins.spec
            g.add_node(ins.id, kind=kind, name=spec.name if spec else ins.id,
                       description=spec.description if spec else None, tool=bool(spec and spec.tool),
                       **({"pause_before": True} if spec is not None and spec.pause_before else {}),
                       **({"effect": True} if spec is not None and spec.effect else {}))
            if ins.op == "map":
                g.nodes[ins.id]["over"] = ins.node.over
            if ins.op in ("stage", "subflow", "map"):
                g.add_edge(ins.id, self.node_at(i + 1), label=None)
            elif ins.op == "branch":
                for key, target in ins.targets.items():
                    g.add_edge(ins.id, self.node_at(target), label=key)
            elif ins.op == "fork":
                for spec in ins.node.branches:
                    g.add_node(spec.id, kind="fork-branch", name=spec.name, description=spec.description,
                               tool=spec.tool)
                    g.add_edge(ins.id, spec.id, label="parallel")
                    g.add_edge(spec.id, self.node_at(i + 1), label=None)
            elif ins.op == "loop":
                when = ins.node.when
                label = f"{when}" if isinstance(when, str) else getattr(when, "__name__", "when")
                g.add_edge(ins.id, self.node_at(ins.target), label=f"loop: {label}")
                exits = True
                if isinstance(when, str):
                    arms = set(self.ins[ins.branch_index].targets)
                    exits = arms != {when}
                if exits:
                    g.add_edge(ins.id, self.node_at(i + 1), label="exit")
        return g

    def _query(self) -> Optional[str]:
        """The scope path holding each run's question (`runs.query`, which run snapshots embed): the
        pipeline's `query=`, else the scope's `question` field when it has one ('' turns it off). A stage
        whose function has a `requires_query` attribute (load_snapshot) refuses a pipeline without one."""
        pipeline, fields = self.pipeline, self.pipeline.scope.model_fields
        query = pipeline.query if pipeline.query is not None else ("question" if "question" in fields else None)
        if query and query.split(".")[0].split("[")[0] not in fields:
            raise PipelineError(f"pipeline '{pipeline.name}': query='{query}' names no field of "
                                f"{pipeline.scope.__name__} (fields: {', '.join(fields)})")
        for spec in self.specs:
            needs = getattr(spec.fn, "requires_query", None)
            if needs and not query:
                raise PipelineError(
                    f"pipeline '{pipeline.name}': stage '{spec.id}' {needs}, but the pipeline records no query: "
                    f"{pipeline.scope.__name__} has no `question` field; name the field holding the question with "
                    f"Pipeline('{pipeline.name}', {pipeline.scope.__name__}, query='<field>')")
        return query or None

    def _validate(self) -> None:
        g, name = self.graph, self.pipeline.name
        reachable = nx.descendants(g, START) | {START}
        unreachable = [n for n in g.nodes if n not in reachable and n != END]  # no END: a loop without exit
        if unreachable:
            raise PipelineError(
                f"pipeline '{name}': stage '{unreachable[0]}' is unreachable (every path before it jumps elsewhere); "
                f"remove it or route a branch to it"
            )
        can_finish = nx.ancestors(g, END) | {END}
        stuck = [n for n in g.nodes if n not in can_finish and n != START]
        stuck.sort(key=lambda n: g.nodes[n]["kind"] not in ("decider", "loop"))  # name the loop's decider
        if stuck:
            raise PipelineError(
                f"pipeline '{name}': loop without exit at stage '{stuck[0]}' — no path from it reaches the end; "
                f"give the loop's branch an arm that leaves it, or use loop_to(..., when=...)"
            )

    # -- exports ----------------------------------------------------------------------
    def spec(self) -> dict[str, Any]:
        """The graph as a JSON-able dict."""
        g = self.graph
        return {
            "name": self.pipeline.name,
            "scope": self.pipeline.scope.__name__,
            "fields": list(self.pipeline.scope.model_fields),
            "nodes": [{"id": n, **{k: v for k, v in d.items()}} for n, d in g.nodes(data=True)],
            "edges": [{"source": a, "target": b, "label": d.get("label")} for a, b, d in g.edges(data=True)],
        }

    def mermaid(self) -> str:
        """The graph as a Mermaid flowchart."""
        shapes = {"decider": ('{"', '"}'), "fork": ('{{"', '"}}'), "subflow": ('[["', '"]]'),
                  "loop": ('(("', '"))'), "map": ('[/"', '"/]'), "start": ('(["', '"])'), "end": ('(["', '"])')}
        ids = {n: f"n{i}" for i, n in enumerate(self.graph.nodes)}
        lines = ["flowchart TD"]
        for n, d in self.graph.nodes(data=True):
            left, right = shapes.get(d["kind"], ('["', '"]'))
            label = str(d.get("name") or n).replace('"', "'") + (f" (each of {d['over']})" if d.get("over") else "")
            lines.append(f"    {ids[n]}{left}{label}{right}")
        for a, b, d in self.graph.edges(data=True):
            label = d.get("label")
            arrow = f" -->|{str(label).replace('|', '/')}| " if label else " --> "
            lines.append(f"    {ids[a]}{arrow}{ids[b]}")
        return "\n".join(lines)

    def fingerprint(self) -> str:
        """A stable hash of the graph and every stage's code."""
        h = hashlib.sha256(json.dumps(self.spec(), sort_keys=True, default=str).encode())
        for spec in self.specs:
            h.update(spec.id.encode())
            if spec.fn is not None:
                h.update(code_fingerprint(spec.fn))
        for ins in self.ins:
            if ins.op == "subflow":
                h.update(ins.node.flow.hash.encode())
            elif ins.op == "loop" and callable(ins.node.when):
                h.update(code_fingerprint(ins.node.when))
        return h.hexdigest()[:16]


def code_fingerprint(fn: Callable[..., Any]) -> bytes:
    """Bytes that change when a stage's code changes (stable across processes)."""
    while isinstance(fn, functools.partial) or getattr(fn, "effect_of", None) is not None:
        fn = fn.func if isinstance(fn, functools.partial) else fn.effect_of  # an effect stage: its function's code
    code = getattr(fn, "__code__", None) or getattr(getattr(fn, "__call__", None), "__code__", None)
    if code is None:
        return (getattr(fn, "__qualname__", None) or type(fn).__qualname__).encode()
    return _code_bytes(code)


def _code_bytes(code: types.CodeType) -> bytes:
    parts = [code.co_code, repr(code.co_names).encode()]
    for const in code.co_consts:
        parts.append(_code_bytes(const) if isinstance(const, types.CodeType) else _const_repr(const).encode())
    return hashlib.sha256(b"\0".join(parts)).digest()


def _const_repr(const: Any) -> str:
    """repr of a code constant, with set order (which varies with PYTHONHASHSEED) made stable."""
    if isinstance(const, frozenset):
        return "frozenset({" + ", ".join(sorted(_const_repr(c) for c in const)) + "})"
    if isinstance(const, tuple):
        return "(" + ", ".join(_const_repr(c) for c in const) + ",)"
    return repr(const)
