"""Declaring stage graphs: a fluent builder compiled to a small jump program.

    flow = (Pipeline("agent", Agent)
            .then(think)
            .branch(route, {"tool": call_tool, "final": answer})
            .loop_to("think", when="tool", max_iterations=8)
            .build())

Branch arms are a stage function, a `Pipeline` over the same scope (inlined), or
the id of another stage (a jump; a jump backwards is a loop, guarded by the
pipeline's `max_iterations`). `loop_to(target, when=...)` jumps back to `target`
while `when` holds: a branch key of the branch just before it, or a predicate
`fn(scope) -> bool` recorded as a decision. `ctx.break_loop(reason)` in any stage
inside a loop leaves it after that stage.
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Generic, Mapping, Optional, TypeVar, Union

from pydantic import BaseModel

from .errors import PipelineError

if TYPE_CHECKING:
    from .flow import Flow

S = TypeVar("S", bound=BaseModel)


@dataclass
class StageSpec:
    """A stage: the function, its stable id, display name and description."""

    id: str
    name: str
    fn: Callable[..., Any]
    description: Optional[str] = None
    kind: str = "stage"  # stage | decider | fork-branch | subflow | loop
    is_async: bool = False
    takes_ctx: bool = False
    tool: bool = False  # exported to OpenTelemetry as `execute_tool {name}`


def stage_spec(fn: Callable[..., Any], *, id: Optional[str] = None, name: Optional[str] = None,
               description: Optional[str] = None, kind: str = "stage", tool: bool = False) -> StageSpec:
    """Describe a stage function: id, name, async-ness, whether it takes the context."""
    if not callable(fn):
        raise PipelineError(f"a stage must be a function fn(scope) or fn(scope, ctx), got {fn!r}")
    inner = fn.func if isinstance(fn, functools.partial) else fn
    base = getattr(inner, "__name__", None) or type(inner).__name__
    target = fn if inspect.isfunction(fn) or inspect.ismethod(fn) else getattr(fn, "__call__", fn)
    try:
        # signature(fn) handles partials and callable objects (self dropped) alike
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    if len(params) > 2 or (not params and not inspect.isbuiltin(fn)):
        raise PipelineError(
            f"stage '{base}' must take (scope) or (scope, ctx), but its signature is "
            f"{_signature(fn)}; wrap it in a function of that shape"
        )
    is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(target)
    return StageSpec(id=id or base, name=name or base, fn=fn, description=description or _doc(fn),
                     kind=kind, is_async=is_async, takes_ctx=len(params) == 2, tool=tool)


def _signature(fn: Callable[..., Any]) -> str:
    try:
        return str(inspect.signature(fn))
    except (TypeError, ValueError):
        return "(unknown)"


def _doc(fn: Callable[..., Any]) -> Optional[str]:
    doc = inspect.getdoc(fn) if inspect.isfunction(fn) else None
    return doc.strip().splitlines()[0] if doc else None


# -- declared nodes (what the builder collects) ----------------------------------

@dataclass
class StageNode:
    spec: StageSpec


@dataclass
class BranchNode:
    decider: StageSpec
    arms: dict[str, Union[list, str]]  # inline nodes, or the id of a stage to jump to


@dataclass
class ForkNode:
    id: str
    name: str
    branches: list[StageSpec]


@dataclass
class SubflowNode:
    spec: StageSpec  # fn is unused; id/name/description describe the step
    flow: "Flow"
    inputs: Union[Mapping[str, str], Callable[[Any], dict]]
    outputs: Mapping[str, str]


@dataclass
class LoopNode:
    id: str
    target: str
    when: Union[str, Callable[[Any], bool]]
    max_iterations: int


class Pipeline(Generic[S]):
    """Fluent builder of a stage graph over the scope model `scope`."""

    def __init__(self, name: str, scope: type[S], *, description: Optional[str] = None,
                 max_iterations: int = 25, query: Optional[str] = None) -> None:
        if not (isinstance(scope, type) and issubclass(scope, BaseModel)):
            raise PipelineError(f"pipeline '{name}': the scope must be a pydantic BaseModel subclass, got {scope!r}")
        self.name = name
        self.scope = scope
        self.description = description
        self.max_iterations = max_iterations
        self.query = query  # scope path holding the run's question (used by run snapshots)
        self.nodes: list[Any] = []

    def then(self, fn: Callable[..., Any], *, id: Optional[str] = None, name: Optional[str] = None,
             description: Optional[str] = None, tool: bool = False) -> "Pipeline[S]":
        """Run `fn(scope)` (or `fn(scope, ctx)`, sync or async) next."""
        self.nodes.append(StageNode(stage_spec(fn, id=id, name=name, description=description, tool=tool)))
        return self

    def branch(self, decider: Callable[..., Any], arms: Mapping[str, Any], *, id: Optional[str] = None,
               name: Optional[str] = None, description: Optional[str] = None) -> "Pipeline[S]":
        """Run `decider(scope)`, which returns one of `arms`' keys (or a `decide(...)` result)."""
        if not arms:
            raise PipelineError(f"pipeline '{self.name}': branch '{id or getattr(decider, '__name__', decider)}' has no arms")
        spec = stage_spec(decider, id=id, name=name, description=description, kind="decider")
        self.nodes.append(BranchNode(spec, {str(k): self._arm(spec.id, k, v) for k, v in arms.items()}))
        return self

    def _arm(self, decider: str, key: str, arm: Any) -> Union[list, str]:
        from .flow import Flow

        if isinstance(arm, str):
            return arm
        if isinstance(arm, (Pipeline, Flow)):
            source = arm if isinstance(arm, Pipeline) else arm.pipeline
            if source.scope is not self.scope:
                raise PipelineError(
                    f"branch '{decider}' arm '{key}': pipeline '{source.name}' uses scope "
                    f"{source.scope.__name__}, not {self.scope.__name__}; use .subflow(...) with inputs/outputs mapping"
                )
            return list(source.nodes)
        return [StageNode(stage_spec(arm))]

    def fork(self, *fns: Callable[..., Any], id: Optional[str] = None, name: Optional[str] = None) -> "Pipeline[S]":
        """Run the stages concurrently (threads for sync, asyncio.gather for async)."""
        if len(fns) < 2:
            raise PipelineError(f"pipeline '{self.name}': a fork needs at least two stages")
        specs = [stage_spec(f, kind="fork-branch") for f in fns]
        fork_id = id or "fork(" + ",".join(s.id for s in specs) + ")"
        self.nodes.append(ForkNode(fork_id, name or fork_id, specs))
        return self

    def subflow(self, flow: "Flow", *, inputs: Union[Mapping[str, str], Callable[[Any], dict]],
                outputs: Mapping[str, str], id: Optional[str] = None, name: Optional[str] = None,
                description: Optional[str] = None) -> "Pipeline[S]":
        """Run another flow as a child run: `inputs` maps child field ← parent field (or is
        `fn(scope) -> dict`), `outputs` maps parent field ← child field."""
        from .flow import Flow

        if not isinstance(flow, Flow):
            raise PipelineError(f"pipeline '{self.name}': subflow needs a built flow (call .build()), got {flow!r}")
        sid = id or flow.name
        checks = [(outputs, self.scope, flow.scope, "outputs")]
        if not callable(inputs):
            checks.append((inputs, flow.scope, self.scope, "inputs"))
        for mapping, left, right, which in checks:  # {left field: right field}
            for a, b in mapping.items():
                bad = a if a not in left.model_fields else b if b not in right.model_fields else None
                if bad is not None:
                    model = left if bad == a and a not in left.model_fields else right
                    raise PipelineError(
                        f"subflow '{sid}' {which}={{{a!r}: {b!r}}}: {model.__name__} has no field '{bad}' "
                        f"(fields: {', '.join(model.model_fields)})")
        spec = StageSpec(id=sid, name=name or sid, fn=_no_op, description=description or flow.pipeline.description,
                         kind="subflow", is_async=flow.has_async)
        self.nodes.append(SubflowNode(spec, flow, inputs, dict(outputs)))
        return self

    def loop_to(self, target: str, *, when: Union[str, Callable[[Any], bool]], max_iterations: int = 10,
                id: Optional[str] = None) -> "Pipeline[S]":
        """Jump back to stage `target` while `when` holds (a branch key or `fn(scope) -> bool`)."""
        if max_iterations < 1:
            raise PipelineError(f"pipeline '{self.name}': loop_to('{target}') needs max_iterations >= 1")
        self.nodes.append(LoopNode(id or f"loop→{target}", target, when, max_iterations))
        return self

    def build(self) -> "Flow[S]":
        """Validate and compile; errors name the offending stage."""
        from .flow import Flow

        return Flow(self)


def _no_op(scope: Any) -> None:
    return None
