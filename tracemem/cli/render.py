"""Plain-text rendering for people: aligned tables and a progress bar on stderr.

Stored text comes from models, users and tools; printed raw, an ANSI escape or a `\r` in it would
drive the operator's terminal (recolour, hide or rewrite lines). So everything printed for people
goes through `visible()`, which shows control characters as escapes (`\x1b`, `\r`) instead.
"""
from __future__ import annotations

import json
import math
import sys
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable, Sequence, TextIO

from ..text import clip

__all__ = ["Progress", "Visible", "cell", "iso", "iso_ns", "table", "to_json", "visible"]

# C0 controls but newline and tab, DEL, C1 controls (0x9b is a one-byte CSI), bidi overrides
_ESCAPES = {chr(c): f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if c not in (0x09, 0x0A)}
_ESCAPES.update({"\r": "\\r", **{chr(c): f"\\u{c:04x}" for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))}})
_VISIBLE = str.maketrans(_ESCAPES)


def visible(text: str) -> str:
    """`text` with terminal control characters written as escapes, so they are shown, not obeyed."""
    return text.translate(_VISIBLE)


class Visible:
    """A text stream that writes through `visible()` (what the CLI prints for people)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(visible(text))
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)



def cell(value: Any, width: int = 60) -> str:
    if value is None:
        text = ""
    elif isinstance(value, datetime):
        text = value.strftime("%Y-%m-%d %H:%M:%S")
    elif isinstance(value, float):
        text = f"{value:.3f}".rstrip("0").rstrip(".")
    elif isinstance(value, (dict, list)):
        text = json.dumps(value, default=str)
    else:
        text = str(value)
    return clip(visible(text), width)


def table(columns: Sequence[str], rows: Iterable[Sequence[Any]], width: int = 60) -> str:
    body = [[cell(v, width) for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in body]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in body]
    if not body:
        lines.append("(no rows)")
    return "\n".join(lines)


_EPOCH = datetime(1970, 1, 1)


def iso(when: datetime) -> str:
    """The one time format of `--json` output: ISO 8601 in UTC, e.g. 2025-01-31T09:15:02.123456Z
    (stored times are naive UTC; an aware time is converted)."""
    if when.tzinfo is not None:
        when = when.astimezone(timezone.utc).replace(tzinfo=None)
    return when.isoformat(timespec="microseconds") + "Z"


def iso_ns(ns: Any) -> Any:
    """`iso()` of a time recorded as nanoseconds since the epoch (None stays None)."""
    return None if ns is None else iso(_EPOCH + timedelta(microseconds=int(ns) // 1000))


def to_json(value: Any) -> str:
    """JSON for scripts: times as `iso()` strings; NaN and ±Infinity, which JSON lacks, become null."""
    return json.dumps(_finite(value), default=str, indent=2, allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, datetime):
        return iso(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


class Progress:
    """A one-line progress bar on stderr (only when stderr is a terminal)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.active = sys.stderr.isatty()

    def __call__(self, done: int, total: int) -> None:
        if not self.active:
            return
        filled = int(30 * done / max(total, 1))
        sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (30 - filled)}] {done}/{total}")
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()
