"""``Tool``: a Python function a model may call, with its JSON schema derived by pydantic.

The schema comes from what the author already wrote: type hints give the types
(pydantic models, enums, ``Literal``, ``Optional`` and defaults included), the
docstring gives the description and, from its ``Args:`` section, each parameter's.
The same pydantic model that produced the schema validates what the model sends
back, so a bad argument is reported naming the tool and the field, never passed on.
"""
from __future__ import annotations

import asyncio
import inspect
import json
import re
import typing
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Callable, Iterable, Optional, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from pydantic.fields import FieldInfo

from tracemem.models import ToolSpec

from .docstrings import parse_docstring
from .errors import ToolArgumentsError, ToolDefinitionError, ToolError

NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # what OpenAI (and Anthropic) accept as a tool name

Arguments = Union[Mapping[str, Any], str, bytes, None]
"""What a model sends: a dict, raw JSON text (as on the wire), or None for no arguments."""


def _strip_titles(schema: Any) -> Any:
    """Drop pydantic's generated ``title`` keys (noise tokens for the model), never a property called title."""
    if isinstance(schema, dict):
        out = {}
        for key, value in schema.items():
            if key == "title" and isinstance(value, str):
                continue
            if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
                out[key] = {name: _strip_titles(sub) for name, sub in value.items()}
            else:
                out[key] = _strip_titles(value)
        return out
    if isinstance(schema, list):
        return [_strip_titles(item) for item in schema]
    return schema


def _shown(value: Any) -> str:
    text = json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def _has_description(annotation: Any) -> bool:
    if get_origin(annotation) is Annotated:
        return any(isinstance(m, FieldInfo) and m.description for m in get_args(annotation)[1:])
    return False


@dataclass(frozen=True, eq=False)
class Tool:
    """A function a model may call. Build one with ``@tool`` or ``Tool.from_function(fn)``.

    ``spec`` is what the model is told (``ToolSpec``; ``openai_schema()`` for the OpenAI
    format); ``validate`` checks what it sends; ``call``/``acall`` validate then run the
    function (sync or async). Calling the Tool itself calls the plain function.
    ``injected`` parameters are left out of the schema and supplied by the caller
    (e.g. the scope or the stage context), so a model can neither see nor forge them.

    A tool has side effects unless declared ``pure=True`` (a lookup, a calculation): a tool
    agent makes each call of it once, and a replay, a fork or a counterfactual answers it
    from the record (tracemem/flow/effects.py). ``needs_approval=True`` makes a tool agent
    pause before running it, for a person to approve, reject or edit each call.
    """

    name: str
    description: str
    function: Callable[..., Any]
    arguments_model: type[BaseModel]
    spec: ToolSpec
    injected: tuple[str, ...] = ()
    is_async: bool = False
    _fields: tuple[str, ...] = field(default=(), repr=False)
    pure: bool = False
    needs_approval: bool = False

    @classmethod
    def from_function(cls, fn: Callable[..., Any], *, name: Optional[str] = None, description: Optional[str] = None,
                      inject: Iterable[str] = (), pure: bool = False, needs_approval: bool = False) -> "Tool":
        """A Tool from a function's signature, type hints and docstring."""
        if isinstance(fn, Tool):
            fn = fn.function
        if not callable(fn):
            raise ToolDefinitionError(f"a tool must be a function, got {fn!r:.80}")
        label = name or getattr(fn, "__name__", "")
        if not NAME.match(label):
            raise ToolDefinitionError(f"tool name {label!r} is not allowed: use 1-64 letters, digits, _ or - "
                                      "(pass name= for a lambda or a callable object)", tool=label or None)
        injected = tuple(inject)
        try:
            signature = inspect.signature(fn)
            hints = typing.get_type_hints(fn, include_extras=True)
        except (NameError, TypeError, ValueError) as err:
            raise ToolDefinitionError(f"tool {label!r}: cannot read the type hints of {fn!r:.80} ({err}); "
                                      "make every annotation importable where the function is defined",
                                      tool=label) from None
        summary, docs = parse_docstring(inspect.getdoc(fn))
        fields: dict[str, Any] = {}
        for param in signature.parameters.values():
            if param.name in injected:
                continue
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
                raise ToolDefinitionError(f"tool {label!r}: parameter {param.name!r} is {param.kind.description}; a tool "
                                          "takes named parameters only, so the model can send them as a JSON object",
                                          tool=label)
            annotation = hints.get(param.name, Any)
            default = param.default if param.default is not param.empty else ...
            doc = docs.get(param.name)
            fields[param.name] = (annotation, FieldInfo(default=default, description=doc)
                                  if doc and not _has_description(annotation) else FieldInfo(default=default))
        missing = [n for n in injected if n not in signature.parameters]
        if missing:
            raise ToolDefinitionError(f"tool {label!r}: inject= names {missing} that are not parameters of the function",
                                      tool=label)
        with warnings.catch_warnings():  # a parameter called e.g. `json` shadows a BaseModel method: harmless here
            warnings.simplefilter("ignore")
            try:
                model = create_model(f"{label}_arguments", __config__=ConfigDict(extra="forbid", protected_namespaces=()),
                                     **fields)
                parameters = _strip_titles(model.model_json_schema())
            except Exception as err:  # pydantic says which type it cannot handle
                raise ToolDefinitionError(f"tool {label!r}: pydantic cannot build a JSON schema for its parameters "
                                          f"({type(err).__name__}: {err})", tool=label) from None
        text = description if description is not None else summary
        is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))
        return cls(label, text, fn, model, ToolSpec(label, text, parameters), injected, is_async, tuple(fields),
                   pure, needs_approval)

    @property
    def parameters(self) -> dict[str, Any]:
        """The JSON schema of the arguments."""
        return self.spec.parameters

    def openai_schema(self) -> dict[str, Any]:
        """``{"type": "function", "function": {"name", "description", "parameters"}}``."""
        return self.spec.to_openai()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.function(*args, **kwargs)

    def __repr__(self) -> str:
        flags = "".join(f", {f}=True" for f in ("pure", "needs_approval") if getattr(self, f))
        return f"Tool(name={self.name!r}, parameters={list(self._fields)}, async={self.is_async}{flags})"

    def validate(self, arguments: Arguments) -> dict[str, Any]:
        """The keyword arguments for the function, validated; ToolArgumentsError names the bad field."""
        text = arguments.decode("utf-8", "replace") if isinstance(arguments, bytes) else arguments
        if text is None or (isinstance(text, str) and not text.strip()):
            data: Any = {}
        elif isinstance(text, str):
            try:
                data = json.loads(text)
            except (ValueError, RecursionError) as err:
                raise ToolArgumentsError(
                    f"tool {self.name!r}: the arguments are not valid JSON ({err}): {text[:200]!r}; "
                    "send them as one JSON object", tool=self.name, arguments_text=text) from None
        else:
            data = text
        if not isinstance(data, Mapping):
            raise ToolArgumentsError(f"tool {self.name!r}: the arguments must be a JSON object, got "
                                     f"{type(data).__name__} {json.dumps(data, default=str)[:120]}",
                                     tool=self.name, arguments_text=text if isinstance(text, str) else "")
        try:
            validated = self.arguments_model.model_validate(data)
        except ValidationError as err:
            problems = [(".".join(str(p) for p in e["loc"]) or "(arguments)",
                         e["msg"] if e["type"] == "missing" else f"{e['msg']} (got {_shown(e.get('input'))})")
                        for e in err.errors()]
            shown = "; ".join(f"{where!r}: {msg}" for where, msg in problems[:5])
            raise ToolArgumentsError(f"tool {self.name!r} got invalid arguments: {shown}; call it again with "
                                     "arguments matching its parameters", tool=self.name, field=problems[0][0],
                                     problems=problems, arguments_text=text if isinstance(text, str) else "") from None
        return {name: getattr(validated, name) for name in self._fields}

    def bind(self, arguments: Arguments, injected: Mapping[str, Any]) -> dict[str, Any]:
        """Validated arguments plus the injected values this tool declared (from a possibly larger mapping)."""
        kwargs = self.validate(arguments)
        for name in self.injected:
            if name not in injected:
                raise ToolError(f"tool {self.name!r} needs {name!r} injected; pass it, e.g. "
                                f"tool.call(arguments, {name}=...)", tool=self.name)
            kwargs[name] = injected[name]
        return kwargs

    def call(self, arguments: Arguments = None, /, **injected: Any) -> Any:
        """Validate and run (an async tool runs in a new event loop; inside a running loop use ``acall``)."""
        kwargs = self.bind(arguments, injected)
        if self.is_async:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                return asyncio.run(self.function(**kwargs))
            raise ToolError(f"async tool {self.name!r} called with call() inside a running event loop; "
                            "use `await tool.acall(...)`", tool=self.name)
        return self.function(**kwargs)

    async def acall(self, arguments: Arguments = None, /, **injected: Any) -> Any:
        """Validate and run: async tools are awaited, sync tools run in a worker thread (the loop stays free)."""
        kwargs = self.bind(arguments, injected)
        if self.is_async:
            return await self.function(**kwargs)
        result = await asyncio.to_thread(self.function, **kwargs)
        return await result if inspect.isawaitable(result) else result


def tool(fn: Optional[Callable[..., Any]] = None, /, *, name: Optional[str] = None, description: Optional[str] = None,
         inject: Iterable[str] = (), pure: bool = False, needs_approval: bool = False) -> Any:
    """Make a function a ``Tool``: ``@tool`` or ``@tool(name=..., description=..., inject=("scope",), pure=True,
    needs_approval=True)``."""
    def make(f: Callable[..., Any]) -> Tool:
        return Tool.from_function(f, name=name, description=description, inject=inject, pure=pure,
                                  needs_approval=needs_approval)
    return make if fn is None else make(fn)
