"""The scope a stage receives: looks like the pydantic model, and every access goes to the recorder.

Each flow builds one view class for its scope model, with one property per field
(attribute lookups through a property are faster than `__getattr__`), so a stage
gets IDE completion on `scope.answer` while every read and write is recorded.
"""
from __future__ import annotations

from typing import Any

from .paths import parse_path
from .recorder import StepRecorder
from .schema import ScopeSchema

__all__ = ["ScopeView", "view_class", "new_view", "recorder_of", "write_path"]


class ScopeView:
    """Base of the per-model view classes; attribute access goes to the step recorder. Made by `new_view`."""

    __slots__ = ("_rec",)

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


def view_class(schema: ScopeSchema) -> type[ScopeView]:
    """A ScopeView subclass for `schema`'s model with one property per field."""

    def prop(name: str) -> property:
        return property(lambda self: self._rec.read(name))

    namespace: dict[str, Any] = {"__slots__": ()}
    for name in schema.fields:
        namespace[name] = prop(name)
    return type(f"{schema.model.__name__}View", (ScopeView,), namespace)


_new = object.__new__
_set_recorder = ScopeView._rec.__set__  # type: ignore[attr-defined]  # (the slot's own setter: `view._rec = ...`
#                                         would go to ScopeView.__setattr__, which records a write)


def new_view(cls: type[ScopeView], rec: StepRecorder) -> ScopeView:
    """A view (of class `cls`, from `view_class`) onto `rec`. Two C calls: a class with a Python `__init__`
    costs ~1,100 instructions more to call (callgrind), once per stage."""
    view = _new(cls)
    _set_recorder(view, rec)
    return view


def recorder_of(view: ScopeView) -> StepRecorder:
    """The recorder behind a view (what `decide()` records its evidence into)."""
    return object.__getattribute__(view, "_rec")


def write_path(view: Any, path: str, verb: str, value: Any = None) -> None:
    """`view.<path> = value` (verb "set"), `.append(value)` or `del` through a recording view, so the write is
    validated and recorded as the step's own: a fork's edits, an effect stage's recorded writes replayed."""
    keys = parse_path(path)
    target = view
    for key in keys[:-1] if verb != "append" else keys:
        target = target[key] if isinstance(key, int) or isinstance(target, dict) else getattr(target, str(key))
    if verb == "append":
        target.append(value)
        return
    last = keys[-1]
    by_item = isinstance(last, int) or (isinstance(target, dict) and target is not view)
    if verb == "delete":
        if by_item:
            del target[last]
        else:
            delattr(target, str(last))
    elif by_item:
        target[last] = value
    else:
        setattr(target, str(last), value)
