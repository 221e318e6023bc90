"""What a pipeline declaration is made of: stage specs and the nodes the builder collects.

`Pipeline` (the builder) appends these nodes; `Program` compiles them. They sit
in their own module at the bottom of `flow/` so both can import them and
neither imports the other's module for them.
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Protocol, Union

from ..errors import PipelineError
from ..record import StepKind

@dataclass
class StageSpec:
    """A stage: the function, its stable id, display name and description."""

    id: str
    name: str
    fn: Optional[Callable[..., Any]]  # None for a subflow (the child flow runs instead)
    description: Optional[str] = None
    kind: StepKind = "stage"
    is_async: bool = False
    takes_ctx: bool = False
    tool: bool = False  # exported to OpenTelemetry as `execute_tool {name}`
    pause_before: bool = False  # a declared pause point: the run pauses before this stage begins
    expect: Optional[str] = None  # the type a pause_before point's answer must have, by import path
    effect: bool = False  # it has side effects: made once, replayed after that (flow/effect_stage.py)
    timeout: Optional[float] = None  # seconds; past it the step fails with StageTimeout (flow/timeout.py)

    @property
    def plain(self) -> bool:
        """A sync stage of one argument with no timeout: the runner calls it directly (its hot path)."""
        return not (self.is_async or self.takes_ctx or self.timeout is not None or self.fn is None)


def stage_spec(fn: Callable[..., Any], *, id: Optional[str] = None, name: Optional[str] = None,
               description: Optional[str] = None, kind: StepKind = "stage", tool: bool = False,
               timeout: Optional[float] = None) -> StageSpec:
    """Describe a stage function: id, name, async-ness, whether it takes the context."""
    if not callable(fn):
        raise PipelineError(f"a stage must be a function fn(scope) or fn(scope, ctx), got {fn!r}")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not 0 < timeout < float("inf")):
        raise PipelineError(f"stage '{id or getattr(fn, '__name__', fn)}': timeout must be a number of seconds "
                            f"> 0, got {timeout!r}")
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
                     kind=kind, is_async=is_async, takes_ctx=len(params) == 2, tool=tool,
                     timeout=None if timeout is None else float(timeout))


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
    arms: dict[str, Union[list[Node], str]]  # inline nodes, or the id of a stage to jump to


@dataclass
class ForkNode:
    id: str
    name: str
    branches: list[StageSpec]


@dataclass
class SubflowNode:
    spec: StageSpec  # fn is unused; id/name/description describe the step
    flow: Any  # the child `Flow` (pipeline.py, which imports this module: not named here)
    inputs: Union[Mapping[str, str], Callable[[Any], dict]]
    outputs: Mapping[str, str]


@dataclass
class LoopNode:
    id: str
    target: str
    when: Union[str, Callable[[Any], bool]]
    max_iterations: int


@dataclass
class MapNode:
    spec: StageSpec  # run once per element of the list at `over`, concurrently; kind "map-item" or "tool"
    over: str


Node = Union[StageNode, BranchNode, ForkNode, SubflowNode, LoopNode, MapNode]


class Declaration(Protocol):
    """What compiling reads of a declared pipeline (`Pipeline` is one; program.py compiles it without
    importing pipeline.py, which imports program.py)."""

    name: str
    scope: type
    nodes: list[Node]
    max_iterations: int
    query: Optional[str]
