"""What tracemem needs to know about a scope model: per-field validators, secrets, defaults.

Built once per pydantic model and cached, so the hot path (a stage reading and
writing fields) only does dictionary lookups and one validation per write.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import types
import typing
from typing import TYPE_CHECKING, Annotated, Any, Callable, Optional, Union

import pydantic_core
from pydantic import BaseModel, SecretBytes, SecretStr, TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError

from ..errors import TracememError
from ..surrogates import ESCAPED, escape_surrogates
from .paths import Path, root_of
from .unwritable import refused, surrogate_error

if TYPE_CHECKING:
    from ..masking import HashKey

Salt = Union[bytes, "HashKey"]  # what secrets are hashed with: a store's HashKey, or random bytes without a store

_NOT_VALIDATED = object()


class _PerTurn:
    """Marks a scope field as belonging to one turn of a conversation thread: `Annotated[list[str], PerTurn]`.
    A run that continues another (`flow.run(..., resume=previous)`) starts such a field from its default
    instead of carrying the previous turn's value over (a turn's pending tool calls, its refund requests)."""

    def __repr__(self) -> str:
        return "PerTurn"


PerTurn = _PerTurn()


def _is_secret_annotation(ann: Any) -> bool:
    if ann in (SecretStr, SecretBytes):
        return True
    return any(_is_secret_annotation(arg) for arg in typing.get_args(ann))


_IMMUTABLE = (str, int, float, bool, bytes, type(None))


def _rebuilt(ann: Any) -> bool:
    """True for builtin containers of immutable values (e.g. list[dict[str, str]]): pydantic builds
    new containers when it validates them. Models and Any pass the caller's objects through."""
    if ann in _IMMUTABLE or ann is Ellipsis:
        return True
    origin = typing.get_origin(ann)
    if origin is typing.Literal:
        return True
    if origin is Annotated:
        return _rebuilt(typing.get_args(ann)[0])
    if origin in (list, dict, set, frozenset, tuple, Union) or origin is types.UnionType:
        args = typing.get_args(ann)
        return bool(args) and all(_rebuilt(a) for a in args)
    return False


def _child_annotation(ann: Any, key: Any) -> Any:
    """The annotation of `container[key]` given the container's annotation (Any if unknown)."""
    origin = typing.get_origin(ann)
    if origin is Annotated:
        return _child_annotation(typing.get_args(ann)[0], key)
    if origin is Union or origin is types.UnionType:
        options = [a for a in typing.get_args(ann) if a is not type(None)]
        return _child_annotation(options[0], key) if len(options) == 1 else Any
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        field = ann.model_fields.get(key) if isinstance(key, str) else None
        return field.annotation if field is not None else Any
    args = typing.get_args(ann)
    if origin in (list, typing.List, set, frozenset) or (
        origin is not None and origin.__name__ in ("Sequence", "MutableSequence")
    ):
        return args[0] if args else Any
    if origin in (dict, typing.Dict) or (origin is not None and origin.__name__ in ("Mapping", "MutableMapping")):
        return args[1] if len(args) == 2 else Any
    return Any


class ScopeSchema:
    """Per-model facts: field names, validators, secret fields, defaults, JSON dumping."""

    def __init__(self, model: type[BaseModel]) -> None:
        self.model = model
        self.fields: tuple[str, ...] = tuple(model.model_fields)
        self.field_set = frozenset(self.fields)
        self.keys = [(name, json.dumps(name)) for name in self.fields]  # each field with its JSON key, for dumps
        self.secret = frozenset(
            name
            for name, info in model.model_fields.items()
            if _is_secret_annotation(info.annotation)
            or (isinstance(info.json_schema_extra, dict) and info.json_schema_extra.get("secret"))
        )
        self.per_turn = frozenset(  # fields a conversation's next turn starts afresh (PerTurn)
            name for name, info in model.model_fields.items()
            if any(m is PerTurn for m in info.metadata)
            or (isinstance(info.json_schema_extra, dict) and info.json_schema_extra.get("per_turn")))
        self._adapters: dict[str, TypeAdapter] = {}
        self.validators: dict[str, Callable[[Any], Any]] = {}  # filled by `validator`
        self._sub_adapters: dict[Any, TypeAdapter | None] = {}
        self._field_subs: dict[tuple[str, bool], tuple[TypeAdapter | None, bool]] = {}  # a field's own, or its element's
        self._rebuilt_fields = {name: _rebuilt(info.annotation) for name, info in model.model_fields.items()}
        # fields declared plain int, str, float or bool (no constraints, not secret): validating a value of exactly
        # that type returns it unchanged, so a write of one skips its validator (the recorder's hot path)
        self.exact: dict[str, type] = {name: info.annotation for name, info in model.model_fields.items()
                                       if info.annotation in (int, str, float, bool) and not info.metadata
                                       and name not in self.secret}
        self._plain_construct = _plainly_constructed(model)

    def adapter(self, name: str) -> TypeAdapter:
        """The validator of one top-level field (type and constraints)."""
        adapter = self._adapters.get(name)
        if adapter is None:
            info = self.model.model_fields[name]
            ann = Annotated[info.annotation, *info.metadata] if info.metadata else info.annotation
            adapter = self._adapters[name] = TypeAdapter(ann)
        return adapter

    def validator(self, name: str) -> Callable[[Any], Any]:
        """The validate function of a top-level field: its adapter's core validator, called directly (what
        `TypeAdapter.validate_python` calls with its defaults, without its Python frame: once per write)."""
        validate = self.validators.get(name)
        if validate is None:
            validate = self.validators[name] = self.adapter(name).validator.validate_python
        return validate

    def rebuilt(self, name: str) -> bool:
        """Whether validating field `name` builds fresh containers all the way down, so the
        validated value cannot alias the writer's object (else the scope copies it)."""
        return self._rebuilt_fields[name]

    def sub_adapter(self, path: Path, element: bool) -> tuple[TypeAdapter | None, bool]:
        """Validator for the value at `path` (or for an element appended to it; None = Any), and
        whether its validation builds fresh containers (see `rebuilt`)."""
        if len(path) == 1:  # `scope.items.append(x)`, the common case: worked out once per field
            known = self._field_subs.get((path[0], element))
            if known is None:
                known = self._field_subs[(path[0], element)] = self._sub_adapter(path, element)
            return known
        return self._sub_adapter(path, element)

    def _sub_adapter(self, path: Path, element: bool) -> tuple[TypeAdapter | None, bool]:
        ann: Any = self.model.model_fields[path[0]].annotation
        for key in path[1:]:
            ann = _child_annotation(ann, key)
        if element:
            ann = _child_annotation(ann, 0)
        if ann is Any:
            return None, False
        try:
            cached = self._sub_adapters.get(ann, _NOT_VALIDATED)
        except TypeError:  # unhashable annotation
            return TypeAdapter(ann), False
        if cached is _NOT_VALIDATED:
            cached = self._sub_adapters[ann] = TypeAdapter(ann)
        return cached, _rebuilt(ann)  # type: ignore[return-value]

    def default(self, name: str) -> Any:
        """The default value of a field (what deleting it restores)."""
        return self.model.model_fields[name].get_default(call_default_factory=True, validated_data={})

    def dump(self, root: str, value: Any, salt: Salt) -> str:
        """JSON text of a value written under field `root`; secret fields become a salted hash."""
        if root in self.secret:
            return redact(value, salt)
        if type(value) is int:  # what to_json makes of it, for a fraction of the cost
            return str(value)
        return pydantic_core.to_json(value, fallback=_fallback).decode()

    def dump_scope(self, data: dict[str, Any], salt: Salt, notes: Optional[list[str]] = None) -> str:
        """JSON text of scope data (all fields present in `data`, in model order). With `notes`, text that
        UTF-8 cannot hold is escaped and noted there (else it raises)."""
        try:
            return "{" + ",".join([f"{key}:{self.dump(k, data[k], salt)}" for k, key in self.keys if k in data]) + "}"
        except (PydanticSerializationError, UnicodeError, RecursionError):
            if notes is None:
                raise
        return "{" + ",".join(f"{json.dumps(k)}:{self._dump_field(k, data[k], salt, notes)}"
                              for k in self.fields if k in data) + "}"

    def _dump_field(self, root: str, value: Any, salt: Salt, notes: Optional[list[str]]) -> str:
        try:
            return self.dump(root, value, salt)
        except (PydanticSerializationError, UnicodeError, RecursionError) as err:
            if notes is None:
                raise
            if not surrogate_error(err):
                raise refused("<run input or output>", root, value, err) from None
            notes.append(f"field '{root}' of the run's input or output: {ESCAPED}")
            return self.dump(root, escape_surrogates(value), salt)

    def dump_output(self, data: dict[str, Any], writes: list[Any], salt: Salt,
                    notes: Optional[list[str]] = None, dumped: bool = False) -> str:
        """`runs.output`: the final value of each field the run set whole; the fields it changed
        only in place are named under "$partial" (their changes are in `writes`). Never the whole
        carried-over state, so a long conversation thread stores each message once.
        `dumped`: each write's value is `dump` of what it wrote (no secret masked, nothing escaped), so a field
        last set whole and never changed in place since is its last write's value, not dumped again."""
        whole: dict[str, Optional[str]] = {}  # each field set whole, with its last such write's value
        partial: set[str] = set()
        fields = self.field_set
        for _, _, path, verb, value in writes:  # (unpacked: a tuple's fields, not a NamedTuple's attributes)
            if verb == "set" and path in fields:  # (a field's own name: the path of a whole write)
                whole[path] = value
            else:
                partial.add(root_of(path))
        if dumped and not partial:
            text = "{" + ",".join([f"{key}:{whole[k]}" for k, key in self.keys if k in whole]) + "}"
        else:
            text = self.dump_scope({k: data[k] for k in whole}, salt, notes)
        rest = sorted(partial - whole.keys())
        return text if not rest else text[:-1] + ("," if len(text) > 2 else "") + f'"$partial":{json.dumps(rest)}' + "}"

    def resume(self, base: dict[str, Any], inputs: Any, pipeline: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """Starting scope of a run that continues an earlier one: its final state plus `inputs`, per-turn
        fields back at their defaults (recorded as part of the input, so a replay of the thread agrees)."""
        given = inputs.model_dump(exclude_unset=True) if isinstance(inputs, BaseModel) else dict(inputs or {})
        delta: dict[str, Any] = {name: self.model.model_fields[name].get_default(call_default_factory=True)
                                 for name in self.per_turn if name not in given}
        for name, value in given.items():
            if name not in self.field_set:
                raise TracememError(f"run input for pipeline '{pipeline}' has unknown field '{name}'; "
                                    f"fields of {self.model.__name__}: {', '.join(self.fields)}")
            try:
                delta[name] = self.adapter(name).validate_python(value)
            except ValidationError as err:
                raise TracememError(f"run input '{name}' for pipeline '{pipeline}' is invalid: {short_error(err)}") from None
        return {**base, **delta}, delta

    def initial(self, inputs: Any, pipeline: str) -> dict[str, Any]:
        """Validate a run's input into the starting scope (defaults filled in)."""
        try:
            model = inputs if isinstance(inputs, self.model) else self.model.model_validate(inputs or {})
        except ValidationError as err:
            raise TracememError(
                f"run input for pipeline '{pipeline}' does not fit {self.model.__name__}: "
                f"{short_error(err)}. Pass a dict or {self.model.__name__} instance with valid fields."
            ) from None
        return {name: getattr(model, name) for name in self.fields}

    def construct(self, data: dict[str, Any]) -> BaseModel:
        """The model holding `data` (every field, validated already), as `model_construct` builds it: directly,
        for a model without aliases, extra fields, private attributes or `model_post_init` (a run's output is
        built once per run, and `model_construct`'s per-field alias checks cost ~1.2 µs of a 10-stage run)."""
        if not self._plain_construct or len(data) != len(self.fields) or not self.field_set.issuperset(data):
            return self.model.model_construct(**data)
        model = self.model.__new__(self.model)
        object.__setattr__(model, "__dict__", {name: data[name] for name in self.fields})
        object.__setattr__(model, "__pydantic_fields_set__", set(self.fields))
        object.__setattr__(model, "__pydantic_extra__", None)
        object.__setattr__(model, "__pydantic_private__", None)
        return model

    def rebuild(self, data: dict[str, Any]) -> BaseModel:
        """A model instance from replayed JSON data; redacted secrets stay redacted."""
        clean = {k: ("<redacted>" if k in self.secret else v) for k, v in data.items() if k in self.field_set}
        try:
            return self.model.model_validate(clean)
        except ValidationError:
            return self.model.model_construct(**clean)


def _plainly_constructed(model: type[BaseModel]) -> bool:
    """Whether `model_construct` of a dict holding every field would only set these four attributes."""
    return not (model.__pydantic_root_model__ or model.__pydantic_post_init__ or model.__private_attributes__
                or model.model_config.get("extra") == "allow"
                or any(f.alias is not None or f.validation_alias is not None for f in model.model_fields.values()))


def _fallback(value: Any) -> Any:
    """Values JSON cannot hold (functions, clients) are recorded as a marker, never stringified."""
    return {"$unserializable": type(value).__name__}


def redact(value: Any, salt: Salt) -> str:
    """The recorded form of a secret: a marker and a keyed hash, never the value. `salt`: the store's
    `HashKey` (tracemem/masking.py), or random bytes for a run recorded without a store."""
    raw = value.get_secret_value() if isinstance(value, (SecretStr, SecretBytes)) else value
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")
    elif not isinstance(raw, bytes):
        raw = pydantic_core.to_json(raw, fallback=_fallback)
    digest = (hmac.new(salt, raw, hashlib.sha256).hexdigest() if isinstance(salt, bytes) else salt.hexdigest(raw))[:32]
    return json.dumps({"$redacted": f"hmac-sha256:{digest}"})


def short_error(err: ValidationError) -> str:
    """The first pydantic error as one readable line."""
    first = err.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ()))
    return f"{first['msg']}" + (f" (at {where})" if where else "") + (
        f" and {err.error_count() - 1} more" if err.error_count() > 1 else ""
    )
