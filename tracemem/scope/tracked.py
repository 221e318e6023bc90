"""Tracked copies: the lists, dicts and nested models a stage reads from its scope.

A stage never gets the committed object itself: it gets a private copy whose every
mutation (`append`, item set, `del`, `pop`, `sort`, an attribute set...) is recorded
through the step recorder as a write with its verb and path, then applied to the
copy. Nested containers are copied when first reached, so no in-place change can
touch committed state behind the recorder.
"""
from __future__ import annotations

import copy
from typing import Any, Callable, Protocol

from pydantic import BaseModel

from ..errors import ScopeWriteError
from .paths import Path, format_path


class Recorder(Protocol):
    """What a tracked copy needs of the step recorder (scope/recorder.py), which imports this module."""

    stage: str

    def mutate(self, path: Path, verb: str, value: Any = None, element: bool = False) -> Any: ...


SCALARS = frozenset({int, str, float, bool, type(None), bytes, frozenset})


def track(value: Any, rec: Recorder, path: Path) -> Any:
    """A private, recording copy of a container value (scalars are returned as is)."""
    kind = type(value)
    if kind is list or (isinstance(value, list) and not isinstance(value, TrackedList)):
        return TrackedList(value, rec, path)
    if kind is dict or (isinstance(value, dict) and not isinstance(value, TrackedDict)):
        return TrackedDict(value, rec, path)
    if isinstance(value, BaseModel):
        return TrackedModel(value, rec, path)
    return _frozen(value)


def _frozen(value: Any) -> Any:
    """A value no stage can change behind the recorder: a set as a frozenset (sets are read-only in a
    view: assign a new set to change one), a tuple holding containers deep-copied; anything else as is."""
    if isinstance(value, set):
        return frozenset(value)
    if type(value) is tuple and not all(type(v) in SCALARS for v in value):
        return copy.deepcopy(value)
    return value


def private_copy(value: Any) -> Any:
    """What `unwrap(track(value, ...))` gives, without making the tracked copy: a shallow copy of a list,
    dict or model, a set as a frozenset, a deep copy of a tuple holding containers; scalars as they are."""
    if type(value) in SCALARS:
        return value
    if isinstance(value, list):
        return list(value)
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, BaseModel):
        return copy.copy(value)
    return _frozen(value)


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


def _reached(value: Any, rec: Recorder, path: Path) -> Any:
    """A child reached through a tracked container: scalars and tracked copies as they are, anything
    else as a new tracked copy — which the caller stores back in the slot, so it is made once."""
    if type(value) in SCALARS or isinstance(value, (TrackedList, TrackedDict, TrackedModel)):
        return value
    return track(value, rec, path)


class TrackedList(list):
    """A list copy whose mutations are recorded as scope writes."""

    __slots__ = ("_rec", "_path")

    def __init__(self, items: Any, rec: Recorder, path: Path) -> None:
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
        wrapped = _reached(value, self._rec, self._path + (i,))
        if wrapped is not value:
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

    def __init__(self, items: Any, rec: Recorder, path: Path) -> None:
        dict.__init__(self, items)
        self._rec = rec
        self._path = path

    def __getitem__(self, key: Any) -> Any:
        value = dict.__getitem__(self, key)
        wrapped = _reached(value, self._rec, self._path + (key,))
        if wrapped is not value:
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
    """A nested pydantic model copy whose attribute writes are recorded.

    A model that reads like a dict (`tracemem.models.Message`: `m["role"]`, `m.get("content")`)
    reads the same way here, through the tracked fields."""

    __slots__ = ("_model", "_rec", "_path")

    def __init__(self, model: BaseModel, rec: Recorder, path: Path) -> None:
        object.__setattr__(self, "_model", model.model_copy())
        object.__setattr__(self, "_rec", rec)
        object.__setattr__(self, "_path", path)

    def __getattr__(self, name: str) -> Any:
        model = self._model
        value = getattr(model, name)
        if name not in type(model).model_fields:
            return self._get if name == "get" and callable(value) else value
        wrapped = _reached(value, self._rec, self._path + (name,))
        if wrapped is not value:
            model.__dict__[name] = wrapped
        return wrapped

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in type(self._model).model_fields:
            raise ScopeWriteError(
                self._rec.stage, format_path(self._path + (name,)), value,
                f"{type(self._model).__name__} has no field '{name}'",
            )
        self._model.__dict__[name] = self._rec.mutate(self._path + (name,), "set", value)

    def __getitem__(self, key: Any) -> Any:
        model = self._model
        if isinstance(key, str) and key in type(model).model_fields and hasattr(type(model), "__getitem__"):
            return self.__getattr__(key)
        return model[key]  # type: ignore[index]

    def _get(self, key: Any, default: Any = None) -> Any:
        return self[key] if isinstance(key, str) and key in type(self._model).model_fields else default

    def __eq__(self, other: Any) -> bool:
        other = unwrap(other) if isinstance(other, TrackedModel) else other
        return unwrap(self) == other

    def __repr__(self) -> str:
        return repr(self._model)

    def model_dump(self, **kwargs: Any) -> dict:
        return unwrap(self).model_dump(**kwargs)


