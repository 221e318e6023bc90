"""Values the record cannot hold as they are, caught where a stage writes them and named there.

- Text with lone surrogates (see tracemem/surrogates.py) is stored escaped, and the
  step's logs say so.
- A value that contains itself, or is nested deeper than JSON serialization allows
  (`MAX_DEPTH` levels), or deeper than Python can copy it (its recursion limit), is
  refused with a `ScopeWriteError` that names the stage, the field and the limit,
  instead of a bare `RecursionError` or `PydanticSerializationError`.
"""
from __future__ import annotations

import sys
from typing import Any, Callable

from ..errors import ScopeWriteError
from ..surrogates import ESCAPED, escape_surrogates

MAX_DEPTH = 254
"""The deepest nesting pydantic-core serializes (measured: a list nested 255 levels deep fails)."""


def depth_of(value: Any, budget: int = 1_000_000) -> tuple[int, bool]:
    """How deeply `value` nests (lists, tuples, sets, dicts, models) and whether it contains itself
    (an iterative walk: it must work where recursion failed; it stops after `budget` containers)."""
    deepest, on_path = 0, set()
    stack: list[tuple[Any, int, bool]] = [(value, 1, False)]
    while stack and budget > 0:
        item, depth, leaving = stack.pop()
        if leaving:
            on_path.discard(id(item))
            continue
        is_model = hasattr(item, "model_fields") and hasattr(item, "__dict__")
        if not is_model and not isinstance(item, (list, tuple, set, frozenset, dict)):
            continue
        if id(item) in on_path:
            return deepest, True
        budget -= 1
        on_path.add(id(item))
        deepest = max(deepest, depth)
        stack.append((item, depth, True))
        children = item.values() if isinstance(item, dict) else item.__dict__.values() if is_model else item
        stack.extend((child, depth + 1, False) for child in children)
    return deepest, False


def refused(stage: str, path: str, value: Any, err: BaseException) -> ScopeWriteError:
    """The error for a value that cannot be recorded because of its shape."""
    depth, circular = depth_of(value)
    circular = circular or "Circular reference" in str(err)
    if circular:
        reason = ("the value contains itself (a circular reference), which cannot be recorded as JSON; "
                  "write a copy without the cycle")
    else:
        limit = MAX_DEPTH if not isinstance(err, RecursionError) else sys.getrecursionlimit()
        what = "JSON serialization's limit" if not isinstance(err, RecursionError) else \
            "Python's recursion limit (sys.getrecursionlimit())"
        reason = (f"the value is nested {depth} levels deep; {what} is {limit} "
                  f"(scope values can be nested at most {MAX_DEPTH} levels); flatten it or store it as text")
    shown = f"<{type(value).__name__} containing itself>" if circular else \
        f"<{type(value).__name__} nested {depth} levels>"
    return ScopeWriteError(stage, path, shown, reason)


def surrogate_error(err: BaseException) -> bool:
    return "surrogates not allowed" in str(err)


def dump_escaped(dump: Callable[[Any], str], value: Any, path: str, log: Callable[[str], None]) -> str:
    """The JSON of a value whose text holds lone surrogates, escaped, with a line in the step's logs (`log`)."""
    log(f"tracemem: the value written to '{path}' held {ESCAPED}")
    return dump(escape_surrogates(value))
