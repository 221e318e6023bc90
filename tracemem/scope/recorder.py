"""The per-step recorder behind a scope view: every read with its source, every write validated.

One `StepRecorder` exists per stage execution. Reads come from the stage's own
buffered writes first, then from the committed run state; each read records
where its value came from (the step and write that last set it, or run input).
Writes are validated per field, serialized once, and buffered until the runner
commits them at stage end. Lists, dicts and nested models are handed out as
tracked copies, so in-place mutation (`append`, item set, `del`, `pop`...) is
recorded with its verb and never touches committed state behind the recorder.

The stage sees the recorder through a view (`new_view`): each flow builds one view class
for its scope model, with one property per field (a property lookup is faster than
`__getattr__`), so a stage gets IDE completion on `scope.answer` while every read and
write goes here.
"""
from __future__ import annotations

import copy
from types import MappingProxyType
from typing import Any, Mapping, Optional, Sequence

from pydantic import ValidationError
from pydantic_core import PydanticSerializationError

from ..errors import ScopeReadError, ScopeWriteError
from ..record import Read, Write
from .paths import Path, format_path, parse_path
from .schema import Salt, ScopeSchema, short_error

__all__ = ["RunState", "StepRecorder", "ScopeView", "view_class", "new_view", "recorder_of", "write_path"]
from .tracked import SCALARS, track, unwrap
from .unwritable import dump_escaped, refused, surrogate_error


class RunState:
    """Committed scope data of a run plus, per field, the (step, seq) of its last write."""

    __slots__ = ("schema", "data", "last_write", "salt", "secrets", "escaped")

    def __init__(self, schema: ScopeSchema, data: dict[str, Any], salt: Salt) -> None:
        self.schema = schema
        self.data = data
        self.last_write: dict[str, tuple[int, int]] = {}
        self.salt = salt
        self.secrets: set[str] = set()  # credentials of models the run called (masked in what it records)
        self.escaped = False  # a write's value held text UTF-8 cannot hold, and was stored escaped


class StepRecorder:
    """The recorder of one step: what the stage read (and from where), wrote, logged and emitted."""

    __slots__ = (
        "state", "step", "stage", "overlay", "own", "seen", "proxies",
        "reads", "writes", "ops", "seq", "capture", "evidence", "rows", "logs", "break_reason", "pause",
    )

    def __init__(self, state: RunState, step: int, stage: str, beside_others: bool = False) -> None:
        self.state = state
        self.step = step
        self.stage = stage
        self.overlay: dict[str, Any] = {}
        self.own: dict[str, tuple[int, int]] = {}  # field → (step, seq) of this step's last write to it
        self.seen: dict[str, Optional[tuple[int, int]]] = {}  # field → the source of its last read recorded
        self.proxies: Mapping[str, Any] = _NO_PROXIES  # field → its tracked copy; a dict from the first one
        self.reads: list[Read] = []
        self.writes: list[Write] = []
        # each change as (path, verb, value), for a step that runs beside others (a fork branch, a map item):
        # its changes are merged into the run's state one by one (flow/fork.py); other steps commit `overlay`
        self.ops: Optional[list[tuple[Path, str, Any]]] = [] if beside_others else None
        self.seq = 0
        self.capture: Optional[list[tuple[str, Any]]] = None
        self.evidence: Any = None  # set by decide()
        # extra rows the stage emitted, and its `ctx.log` lines: most stages have none, so these start as the
        # shared empty tuple and become lists on the first (`add_row`, `add_log`)
        self.rows: Sequence[tuple[str, dict[str, Any]]] = ()
        self.logs: Sequence[str] = ()
        self.break_reason: Optional[str] = None  # set by `ctx.break_loop`
        self.pause: Any = None  # set by `ctx.interrupt` (a flow.interrupt.Pause): the step pauses

    def add_row(self, table: str, row: dict[str, Any]) -> None:
        """An extra row this step emitted (`ctx.emit`), for `table`."""
        if self.rows:
            self.rows.append((table, row))  # type: ignore[attr-defined]
        else:
            self.rows = [(table, row)]

    def add_log(self, line: str) -> None:
        """A line kept with this step (`steps.logs`)."""
        if self.logs:
            self.logs.append(line)  # type: ignore[attr-defined]
        else:
            self.logs = [line]

    # -- reads -------------------------------------------------------------
    def read(self, name: str, tracked: bool = True) -> Any:
        """A field's value as the stage sees it (`tracked=False`: the value itself, for the runner's own
        use — a map step's element), the read recorded with where the value came from."""
        source: Optional[tuple[int, int]] = self.own.get(name) if self.own else None
        if source is not None:
            value = self.overlay[name]
        else:
            try:
                value = self.state.data[name]
            except KeyError:
                raise ScopeReadError(
                    f"stage '{self.stage}' read '{name}', which the scope "
                    f"{self.state.schema.model.__name__} does not have; fields: {', '.join(self.state.schema.fields)}"
                ) from None
            source = self.state.last_write.get(name)
        # a field's source within a step only moves on (committed → own writes), so a read is new when its
        # source differs from the last one recorded for the field
        if self.seen.get(name, _UNSEEN) != source:
            self.seen[name] = source
            self.seq += 1
            if source is None:
                self.reads.append(Read(self.step, self.seq, name, None, None))
            else:
                self.reads.append(Read(self.step, self.seq, name, source[0], source[1]))
        if self.capture is not None:
            self.capture.append((name, value))
        if type(value) in SCALARS or not tracked:
            return value
        proxy = self.proxies.get(name)
        if proxy is not None:
            return proxy
        tracked = track(value, self, (name,))
        if tracked is not value:
            if not self.proxies:
                self.proxies = {}
            self.proxies[name] = tracked  # type: ignore[index]
        return tracked

    # -- writes ------------------------------------------------------------
    def set_field(self, name: str, value: Any) -> None:
        schema = self.state.schema
        if type(value) is not schema.exact.get(name):  # else valid as it is (`ScopeSchema.exact`)
            if self.proxies and value is not None and value is self.proxies.get(name):
                return  # `scope.items += [x]`: the in-place change is already recorded (as appends)
            value = self._validated(name, value)
        try:
            dumped = schema.dump(name, value, self.state.salt)
        except (RecursionError, PydanticSerializationError, UnicodeError) as err:
            dumped = self._unstorable(name, name, value, err)
        self.seq += 1
        self.writes.append(Write(self.step, self.seq, name, "set", dumped))
        if self.ops is not None:
            self.ops.append(((name,), "set", value))
        self.overlay[name] = value
        self.own[name] = (self.step, self.seq)
        if self.proxies:
            self.proxies.pop(name, None)  # type: ignore[attr-defined]

    def _validated(self, name: str, value: Any) -> Any:
        """A value written to field `name` as the scope keeps it: validated, and its own copy."""
        schema = self.state.schema
        if name not in schema.field_set:
            raise ScopeWriteError(
                self.stage, name, value,
                f"the scope {schema.model.__name__} has no field '{name}' (fields: {', '.join(schema.fields)})",
            )
        try:
            validate = schema.validators.get(name) or schema.validator(name)
            value = validate(value if type(value) in SCALARS else unwrap(value))
            return value if type(value) in SCALARS or schema.rebuilt(name) else _owned(value)
        except ValidationError as err:
            shown = "<redacted>" if name in schema.secret else value
            raise ScopeWriteError(self.stage, name, shown, short_error(err)) from None
        except RecursionError as err:
            raise refused(self.stage, name, value, err) from None

    def delete_field(self, name: str) -> None:
        self.set_field(name, self.state.schema.default(name))

    def mutate(self, path: Path, verb: str, value: Any = None, element: bool = False) -> Any:
        """Record an in-place change at `path` made through a tracked container."""
        schema, where, dumped = self.state.schema, format_path(path), None
        if verb != "delete":
            adapter, rebuilt = schema.sub_adapter(path, element)
            raw = unwrap(value)
            try:
                value = raw if adapter is None else adapter.validate_python(raw)
            except ValidationError as err:
                shown = "<redacted>" if path[0] in schema.secret else raw
                raise ScopeWriteError(self.stage, where, shown, short_error(err)) from None
            except RecursionError as err:
                raise refused(self.stage, where, raw, err) from None
            try:
                if type(value) not in SCALARS and not rebuilt:
                    value = _owned(value)
                dumped = schema.dump(path[0], value, self.state.salt)
            except (RecursionError, PydanticSerializationError, UnicodeError) as err:
                dumped = self._unstorable(path[0], where, value, err)
        root = path[0]
        proxy = self.proxies.get(root)
        if proxy is None:
            raise ScopeWriteError(
                self.stage, where, value,
                f"this copy of '{root}' was read before '{root}' was reassigned in the same stage; "
                f"read scope.{root} again after assigning it",
            )
        self.seq += 1
        self.writes.append(Write(self.step, self.seq, where, verb, dumped))  # type: ignore[arg-type]
        if self.ops is not None:
            self.ops.append((path, verb, value))
        self.overlay[root] = proxy
        self.own[root] = (self.step, self.seq)
        return value

    def _unstorable(self, root: str, path: str, value: Any, err: BaseException) -> str:
        """A written value pydantic could not dump: text UTF-8 cannot hold is stored escaped (and the step's
        logs say so); a value that contains itself or nests too deeply raises a ScopeWriteError naming the
        field and the limit (scope/unwritable.py)."""
        if not surrogate_error(err):
            raise refused(self.stage, path, value, err) from None
        schema, salt = self.state.schema, self.state.salt
        self.state.escaped = True
        return dump_escaped(lambda v: schema.dump(root, v, salt), value, path, self.add_log)

    def commit(self) -> None:
        """Make this step's writes the run's committed state (the runner calls it when the stage ends)."""
        own = self.own
        if own:
            data, last_write = self.state.data, self.state.last_write
            data |= self.overlay  # (`|=` is `update` without its argument parsing: ~450 fewer instructions)
            last_write |= own
            if self.proxies:  # a container was read, so the overlay may hold tracked copies: keep plain data
                for name in own:
                    data[name] = unwrap(data[name])


_UNSEEN = object()
_NO_PROXIES: Mapping[str, Any] = MappingProxyType({})  # (read-only: no recorder can fill the shared one)


def _owned(value: Any) -> Any:
    """The scope keeps its own copy of a written container: the caller (or another field) may still
    hold the object — pydantic passes model instances through — and must not change it unrecorded.
    (An object with its own `__deepcopy__`, as models have, is asked directly: what `copy.deepcopy` does
    for it, without the dispatch.)"""
    copier = getattr(type(value), "__deepcopy__", None)
    return copier(value, {}) if copier is not None else copy.deepcopy(value)


# -- the view a stage receives: looks like the pydantic model, every access goes to the recorder ----------

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
