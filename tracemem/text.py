"""Short, one-line views of text for errors, traces, prompts and tables.

Everything tracemem shows a person (an error naming a value, a trace line, a
table cell, a quoted memory) goes through `clip`, so long or multi-line values
never break the layout and are cut the same way everywhere.
"""
from __future__ import annotations

__all__ = ["clip"]


def clip(text: object, limit: int = 60) -> str:
    """`text` on one line (runs of whitespace collapsed), cut to `limit` characters with "…"."""
    one_line = " ".join(str(text).split())
    return one_line if len(one_line) <= limit else one_line[: max(limit - 1, 0)] + "…"
