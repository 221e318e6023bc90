"""The typed scope a stage sees: looks like the pydantic model, records every read and write.

One `StageScope` exists per stage execution. Reads come from the stage's own
buffered writes first, then from the committed run state; each read records
where its value came from (the step and write that last set it, or run input).
Writes are validated per field, serialized once, and buffered until the runner
commits them at stage end. Lists, dicts and nested models are handed out as
tracked copies, so in-place mutation (`append`, item set, `del`, `pop`...) is
recorded with its verb and never touches committed state behind the recorder.
"""
from __future__ import annotations

import copy
from typing import Any, Optional

from pydantic import ValidationError

from .errors import ScopeReadError, ScopeWriteError
from .paths import Path, format_path
from .record import Read, Write
from .schema import ScopeSchema, short_error
from .tracked import _SCALARS, track, unwrap



class RunState:
    """Committed scope data of a run plus, per field, the (step, seq) of its last write."""

    __slots__ = ("schema", "data", "last_write", "salt")

    def __init__(self, schema: ScopeSchema, data: dict[str, Any], salt: bytes) -> None:
        self.schema = schema
        self.data = data
        self.last_write: dict[str, tuple[int, int]] = {}
        self.salt = salt


class StageScope:
    """Per-step recorder behind a scope view; the runner commits it at stage end."""

    __slots__ = (
        "state", "step", "stage", "overlay", "own", "seen", "proxies",
        "reads", "writes", "ops", "seq", "capture", "evidence", "rows", "ctx",  # ctx: set only if the stage takes one
    )

    def __init__(self, state: RunState, step: int, stage: str) -> None:
        self.state = state
        self.step = step
        self.stage = stage
        self.overlay: dict[str, Any] = {}
        self.own: dict[str, int] = {}
        self.seen: set = set()
        self.proxies: dict[str, Any] = {}
        self.reads: list[Read] = []
        self.writes: list[Write] = []
        self.ops: list[tuple[Path, str, Any]] = []
        self.seq = 0
        self.capture: Optional[list[tuple[str, Any]]] = None
        self.evidence: Any = None  # set by decide()
        self.rows: list[tuple[str, dict[str, Any]]] = []  # extra rows emitted by the stage

    # -- reads -------------------------------------------------------------
    def read(self, name: str) -> Any:
        own = self.own.get(name)
        if own is not None:
            value = self.overlay[name]
            source: Optional[tuple[int, int]] = (self.step, own)
        else:
            try:
                value = self.state.data[name]
            except KeyError:
                raise ScopeReadError(
                    f"stage '{self.stage}' read '{name}', which the scope "
                    f"{self.state.schema.model.__name__} does not have; fields: {', '.join(self.state.schema.fields)}"
                ) from None
            source = self.state.last_write.get(name)
        key = (name, source)
        if key not in self.seen:
            self.seen.add(key)
            self.seq += 1
            if source is None:
                self.reads.append(Read(self.step, self.seq, name, None, None))
            else:
                self.reads.append(Read(self.step, self.seq, name, source[0], source[1]))
        if self.capture is not None:
            self.capture.append((name, value))
        if type(value) in _SCALARS:
            return value
        proxy = self.proxies.get(name)
        if proxy is not None:
            return proxy
        tracked = track(value, self, (name,))
        if tracked is not value:
            self.proxies[name] = tracked
        return tracked

    # -- writes ------------------------------------------------------------
    def set_field(self, name: str, value: Any) -> None:
        if self.proxies and value is not None and value is self.proxies.get(name):
            return  # `scope.items += [x]`: the in-place change is already recorded (as appends)
        schema = self.state.schema
        if name not in schema.field_set:
            raise ScopeWriteError(
                self.stage, name, value,
                f"the scope {schema.model.__name__} has no field '{name}' (fields: {', '.join(schema.fields)})",
            )
        try:
            value = schema.adapter(name).validate_python(unwrap(value))
        except ValidationError as err:
            shown = "<redacted>" if name in schema.secret else value
            raise ScopeWriteError(self.stage, name, shown, short_error(err)) from None
        if type(value) not in _SCALARS and not schema.rebuilt(name):
            value = _owned(value)
        self.seq += 1
        self.writes.append(Write(self.step, self.seq, name, "set", schema.dump(name, value, self.state.salt)))
        self.ops.append(((name,), "set", value))
        self.overlay[name] = value
        self.own[name] = self.seq
        self.proxies.pop(name, None)

    def delete_field(self, name: str) -> None:
        self.set_field(name, self.state.schema.default(name))

    def mutate(self, path: Path, verb: str, value: Any = None, element: bool = False) -> Any:
        """Record an in-place change at `path` made through a tracked container."""
        schema = self.state.schema
        if verb != "delete":
            adapter, rebuilt = schema.sub_adapter(path, element)
            raw = unwrap(value)
            try:
                value = raw if adapter is None else adapter.validate_python(raw)
            except ValidationError as err:
                shown = "<redacted>" if path[0] in schema.secret else raw
                raise ScopeWriteError(self.stage, format_path(path), shown, short_error(err)) from None
            if type(value) not in _SCALARS and not rebuilt:
                value = _owned(value)
        root = path[0]
        proxy = self.proxies.get(root)
        if proxy is None:
            raise ScopeWriteError(
                self.stage, format_path(path), value,
                f"this copy of '{root}' was read before '{root}' was reassigned in the same stage; "
                f"read scope.{root} again after assigning it",
            )
        self.seq += 1
        dumped = None if verb == "delete" else schema.dump(root, value, self.state.salt)
        self.writes.append(Write(self.step, self.seq, format_path(path), verb, dumped))
        self.ops.append((path, verb, value))
        self.overlay[root] = proxy
        self.own[root] = self.seq
        return value

    def committed_values(self) -> dict[str, Any]:
        """The plain values of every field this step changed (tracked copies unwrapped)."""
        return {name: unwrap(self.overlay[name]) for name in self.own}


# -- the view ---------------------------------------------------------------------

_VIEW_CLASSES: dict[type, type] = {}


class ScopeView:
    """Base of the per-model view classes; attribute access goes to the step recorder."""

    __slots__ = ("_rec",)

    def __init__(self, rec: StageScope) -> None:
        object.__setattr__(self, "_rec", rec)

    def __setattr__(self, name: str, value: Any) -> None:
        self._rec.set_field(name, value)

    def __delattr__(self, name: str) -> None:
        self._rec.delete_field(name)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self._rec.read(name)

    def __repr__(self) -> str:
        return f"<scope view of {self._rec.state.schema.model.__name__} in stage '{self._rec.stage}'>"


def view_class(schema: ScopeSchema) -> type:
    """A ScopeView subclass with one property per field (faster than __getattr__)."""
    cls = _VIEW_CLASSES.get(schema.model)
    if cls is None:
        def prop(name: str) -> property:
            return property(lambda self: self._rec.read(name))

        namespace: dict[str, Any] = {"__slots__": ()}
        for name in schema.fields:
            namespace[name] = prop(name)
        cls = _VIEW_CLASSES[schema.model] = type(f"{schema.model.__name__}View", (ScopeView,), namespace)
    return cls


def _owned(value: Any) -> Any:
    """The scope keeps its own copy of a written container: the caller (or another field) may still
    hold the object — pydantic passes model instances through — and must not change it unrecorded."""
    return copy.deepcopy(value)
