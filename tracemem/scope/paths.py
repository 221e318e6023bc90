"""Scope paths: `messages[3].content` as text in the store, a tuple in memory.

Replaying a write log (`apply_write`) is how a run's state at any step is rebuilt,
both live and from the DuckDB file, so both sides share this one definition.
"""
from __future__ import annotations

import functools
import json
import re
from typing import Any, Callable

from ..errors import PathError

PathKey = str | int
Path = tuple[PathKey, ...]

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_TOKEN = re.compile(r'\.([A-Za-z_][A-Za-z0-9_]*)|\[(-?\d+)\]|\[("(?:[^"\\]|\\.)*")\]')


def format_path(path: Path) -> str:
    """`("messages", 3, "content")` → `messages[3].content`; odd keys are JSON-quoted."""
    out = [str(path[0])]
    for key in path[1:]:
        if isinstance(key, int):
            out.append(f"[{key}]")
        elif _IDENT.match(key):
            out.append(f".{key}")
        else:
            out.append(f"[{json.dumps(key)}]")
    return "".join(out)


@functools.lru_cache(maxsize=4096)  # as parse_path: a run writes the same few paths over and over
def root_of(text: str) -> str:
    """The top-level field a path text starts with: `messages[3].content` → `messages`."""
    return text.split(".", 1)[0].split("[", 1)[0]


@functools.lru_cache(maxsize=4096)  # replaying a run parses the same few paths thousands of times
def parse_path(text: str) -> Path:
    """Inverse of `format_path`."""
    head = re.match(r"[A-Za-z_][A-Za-z0-9_]*", text)
    if not head:
        raise PathError(f"not a scope path: {text!r} (expected e.g. 'messages[0].content')")
    parts: list[PathKey] = [head.group(0)]
    pos = head.end()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise PathError(f"not a scope path: {text!r} (bad part at character {pos})")
        attr, index, quoted = m.groups()
        parts.append(attr if attr is not None else int(index) if index is not None else json.loads(quoted))
        pos = m.end()
    return tuple(parts)


def _child(container: Any, key: PathKey) -> Any:
    if isinstance(container, (list, dict)):
        return container[key]
    return getattr(container, key)


def _assign(container: Any, key: PathKey, value: Any) -> None:
    if isinstance(container, (list, dict)):
        container[key] = value
    else:
        setattr(container, key, value)


def apply_write(
    data: dict[str, Any], path: Path, verb: str, value: Any, reset: Callable[[str], Any]
) -> None:
    """Apply one recorded write to plain data in place (lists, dicts, objects)."""
    if len(path) == 1:
        if verb == "set":
            data[path[0]] = value
        elif verb == "append":
            data[path[0]].append(value)
        else:
            data[path[0]] = reset(path[0])
        return
    target = data[path[0]]
    for key in path[1:-1]:
        target = _child(target, key)
    last = path[-1]
    if verb == "set":
        _assign(target, last, value)
    elif verb == "append":
        _child(target, last).append(value)
    elif isinstance(target, (list, dict)):
        del target[last]
    else:
        delattr(target, last)
