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

from typing import Any, Callable, Optional

from pydantic import BaseModel, ValidationError

from .errors import ScopeReadError, ScopeWriteError
from .paths import Path, apply_write, format_path
from .record import Read, Write
from .schema import ScopeSchema, short_error

_SCALARS = frozenset({int, str, float, bool, type(None), bytes, tuple, frozenset})


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
            adapter = schema.sub_adapter(path, element)
            raw = unwrap(value)
            try:
                value = raw if adapter is None else adapter.validate_python(raw)
            except ValidationError as err:
                shown = "<redacted>" if path[0] in schema.secret else raw
                raise ScopeWriteError(self.stage, format_path(path), shown, short_error(err)) from None
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


# -- tracked containers ---------------------------------------------------------


def track(value: Any, rec: StageScope, path: Path) -> Any:
    """A private, recording copy of a container value (scalars are returned as is)."""
    kind = type(value)
    if kind is list or (isinstance(value, list) and not isinstance(value, TrackedList)):
        return TrackedList(value, rec, path)
    if kind is dict or (isinstance(value, dict) and not isinstance(value, TrackedDict)):
        return TrackedDict(value, rec, path)
    if isinstance(value, BaseModel):
        return TrackedModel(value, rec, path)
    if isinstance(value, set):
        return frozenset(value)  # sets are read-only in a view: assign a new set to change one
    return value


def unwrap(value: Any) -> Any:
    """Plain data from a tracked copy (recursively); anything else is returned unchanged."""
    if isinstance(value, TrackedList):
        return [unwrap(v) for v in list.__iter__(value)]
    if isinstance(value, TrackedDict):
        return {k: unwrap(v) for k, v in dict.items(value)}
    if isinstance(value, TrackedModel):
        model = value._model
        for name, child in list(model.__dict__.items()):
            if isinstance(child, (TrackedList, TrackedDict, TrackedModel)):
                model.__dict__[name] = unwrap(child)
        return model
    return value


def _wrap_child(rec: StageScope, path: Path, value: Any) -> Any:
    return value if type(value) in _SCALARS else track(value, rec, path)


class TrackedList(list):
    """A list copy whose mutations are recorded as scope writes."""

    __slots__ = ("_rec", "_path")

    def __init__(self, items: Any, rec: StageScope, path: Path) -> None:
        list.__init__(self, items)
        self._rec = rec
        self._path = path

    def _index(self, index: int) -> int:
        size = len(self)
        if not -size <= index < size:
            raise IndexError(f"list index {index} out of range for '{format_path(self._path)}' (length {size})")
        return index % size if size else index

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        i = self._index(index)
        value = list.__getitem__(self, i)
        if type(value) in _SCALARS or isinstance(value, (TrackedList, TrackedDict, TrackedModel)):
            return value
        wrapped = track(value, self._rec, self._path + (i,))
        list.__setitem__(self, i, wrapped)
        return wrapped

    def __iter__(self) -> Any:
        for i in range(len(self)):
            yield self[i]

    def _replace_all(self, new: list) -> None:
        value = self._rec.mutate(self._path, "set", new)
        list.__init__(self, value)

    def append(self, item: Any) -> None:
        list.append(self, self._rec.mutate(self._path, "append", item, element=True))

    def extend(self, items: Any) -> None:
        for item in list(items):
            self.append(item)

    def __iadd__(self, items: Any) -> "TrackedList":
        self.extend(items)
        return self

    def __setitem__(self, index: Any, value: Any) -> None:
        if isinstance(index, slice):
            new = list(list.__iter__(self))
            new[index] = value
            return self._replace_all(new)
        i = self._index(index)
        list.__setitem__(self, i, self._rec.mutate(self._path + (i,), "set", value, element=False))

    def __delitem__(self, index: Any) -> None:
        if isinstance(index, slice):
            new = list(list.__iter__(self))
            del new[index]
            return self._replace_all(new)
        i = self._index(index)
        self._rec.mutate(self._path + (i,), "delete")
        list.__delitem__(self, i)

    def pop(self, index: int = -1) -> Any:
        value = self[index]
        del self[index]
        return value

    def remove(self, value: Any) -> None:
        del self[self.index(value)]

    def _whole(op: str) -> Callable:  # type: ignore[misc]
        def method(self: "TrackedList", *args: Any, **kwargs: Any) -> None:
            new = list(list.__iter__(self))
            getattr(new, op)(*args, **kwargs)
            self._replace_all(new)

        method.__name__ = op
        return method

    insert = _whole("insert")
    clear = _whole("clear")
    sort = _whole("sort")
    reverse = _whole("reverse")

    def __imul__(self, n: int) -> "TrackedList":
        self._replace_all(list(list.__iter__(self)) * n)
        return self

    def __reduce__(self) -> Any:
        return (list, (unwrap(self),))

    def __copy__(self) -> list:
        return list(list.__iter__(self))


class TrackedDict(dict):
    """A dict copy whose mutations are recorded as scope writes."""

    __slots__ = ("_rec", "_path")

    def __init__(self, items: Any, rec: StageScope, path: Path) -> None:
        dict.__init__(self, items)
        self._rec = rec
        self._path = path

    def __getitem__(self, key: Any) -> Any:
        value = dict.__getitem__(self, key)
        if type(value) in _SCALARS or isinstance(value, (TrackedList, TrackedDict, TrackedModel)):
            return value
        wrapped = track(value, self._rec, self._path + (key,))
        dict.__setitem__(self, key, wrapped)
        return wrapped

    def get(self, key: Any, default: Any = None) -> Any:
        return self[key] if key in self else default

    def values(self) -> Any:  # type: ignore[override]
        return [self[k] for k in list(dict.keys(self))]

    def items(self) -> Any:  # type: ignore[override]
        return [(k, self[k]) for k in list(dict.keys(self))]

    def __setitem__(self, key: Any, value: Any) -> None:
        dict.__setitem__(self, key, self._rec.mutate(self._path + (key,), "set", value))

    def __delitem__(self, key: Any) -> None:
        if key not in self:
            raise KeyError(key)
        self._rec.mutate(self._path + (key,), "delete")
        dict.__delitem__(self, key)

    _MISSING = object()

    def pop(self, key: Any, default: Any = _MISSING) -> Any:
        if key not in self:
            if default is TrackedDict._MISSING:
                raise KeyError(key)
            return default
        value = self[key]
        del self[key]
        return value

    def popitem(self) -> tuple:
        key = next(reversed(list(dict.keys(self))))
        return key, self.pop(key)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def clear(self) -> None:
        value = self._rec.mutate(self._path, "set", {})
        dict.clear(self)
        dict.update(self, value)

    def __ior__(self, other: Any) -> "TrackedDict":
        self.update(other)
        return self

    def __reduce__(self) -> Any:
        return (dict, (unwrap(self),))

    def __copy__(self) -> dict:
        return dict(dict.items(self))


class TrackedModel:
    """A nested pydantic model copy whose attribute writes are recorded."""

    __slots__ = ("_model", "_rec", "_path")

    def __init__(self, model: BaseModel, rec: StageScope, path: Path) -> None:
        object.__setattr__(self, "_model", model.model_copy())
        object.__setattr__(self, "_rec", rec)
        object.__setattr__(self, "_path", path)

    def __getattr__(self, name: str) -> Any:
        model = self._model
        value = getattr(model, name)
        if name not in type(model).model_fields or type(value) in _SCALARS:
            return value
        if not isinstance(value, (TrackedList, TrackedDict, TrackedModel)):
            value = _wrap_child(self._rec, self._path + (name,), value)
            model.__dict__[name] = value
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in type(self._model).model_fields:
            raise ScopeWriteError(
                self._rec.stage, format_path(self._path + (name,)), value,
                f"{type(self._model).__name__} has no field '{name}'",
            )
        self._model.__dict__[name] = self._rec.mutate(self._path + (name,), "set", value)

    def __eq__(self, other: Any) -> bool:
        other = unwrap(other) if isinstance(other, TrackedModel) else other
        return unwrap(self) == other

    def __repr__(self) -> str:
        return repr(self._model)

    def model_dump(self, **kwargs: Any) -> dict:
        return unwrap(self).model_dump(**kwargs)


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


def apply_ops(state: RunState, ops: list[tuple[Path, str, Any]]) -> None:
    """Merge a fork branch's writes into committed state, copying containers on the way."""
    data = state.data
    for path, verb, value in ops:
        root = path[0]
        if len(path) > 1 or verb != "set":
            # copy every container the write goes through (for an append, the list itself too)
            data[root] = _copy_along(data[root], path[1:] if verb == "append" else path[1:-1])
        apply_write(data, path, verb, unwrap(value), state.schema.default)


def _copy_along(value: Any, rest: tuple) -> Any:
    """Shallow-copy each container on a path so committed values are never shared in place."""
    if isinstance(value, list):
        copy: Any = list(value)
    elif isinstance(value, dict):
        copy = dict(value)
    elif isinstance(value, BaseModel):
        copy = value.model_copy()
    else:
        return value
    if rest:
        key = rest[0]
        if isinstance(copy, (list, dict)):
            copy[key] = _copy_along(copy[key], rest[1:])
        else:
            copy.__dict__[key] = _copy_along(getattr(copy, key), rest[1:])
    return copy
