"""Which paths of two scopes hold different values: what `run.diff(other)` reports.

A fork changes a value and lets the rest of the run follow; the diff says what came
out differently, path by path (`answer`, `items[2].price`), down to the leaves that
differ, so a changed list element is named, not the whole list.
"""
from __future__ import annotations

from typing import Any, NamedTuple

from .paths import Path, format_path

__all__ = ["Change", "MISSING", "diff_values"]


class _Missing:
    """The value on the side of a diff that lacks the path."""

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


class Change(NamedTuple):
    """One path whose value differs: this run's value, the other run's."""

    path: str
    ours: Any
    theirs: Any


def diff_values(ours: Any, theirs: Any) -> list[Change]:
    """Every leaf path where two JSON-like values differ, in field order (then the other side's extras)."""
    out: list[Change] = []
    _walk(ours, theirs, (), out)
    return out


def _walk(a: Any, b: Any, path: Path, out: list[Change]) -> None:
    if a == b and type(a) is type(b):
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for key in list(a) + [k for k in b if k not in a]:
            _walk(a.get(key, MISSING), b.get(key, MISSING), path + (key,), out)
        return
    if isinstance(a, list) and isinstance(b, list):
        for i in range(max(len(a), len(b))):
            _walk(a[i] if i < len(a) else MISSING, b[i] if i < len(b) else MISSING, path + (i,), out)
        return
    out.append(Change(format_path(path) if path else "", a, b))
