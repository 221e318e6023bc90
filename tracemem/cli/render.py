"""Plain-text rendering for people: aligned tables and a progress bar on stderr."""
from __future__ import annotations

import json
import sys
from datetime import datetime
from typing import Any, Iterable, Sequence

from ..text import clip

__all__ = ["Progress", "cell", "table", "to_json"]


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
    return clip(text, width)


def table(columns: Sequence[str], rows: Iterable[Sequence[Any]], width: int = 60) -> str:
    body = [[cell(v, width) for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in body]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in body]
    if not body:
        lines.append("(no rows)")
    return "\n".join(lines)


def to_json(value: Any) -> str:
    return json.dumps(value, default=str, indent=2)


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
