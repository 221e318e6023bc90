"""Making a batch's values storable: what a DuckDB column cannot hold is changed, and the change
is noted on the run the row belongs to (`runs.notes`).

The fast path hands Python values to Arrow as they are. When that fails — a lone
surrogate such as '\\ud83d' (a truncated emoji escape through `json.loads`) that UTF-8
cannot encode, a token count of 10**12 in an INTEGER column, text where a number
belongs, JSON that DuckDB rejects — the batch is built again through a `Cleaner`:
every value is checked against its column's type; text is escaped (each lone
surrogate becomes the six characters `\\udXXX`; for PostgreSQL, `Cleaner(nul=True)`, each
NUL character `\\u0000`, in text and inside JSON alike), a number out of range or of the
wrong kind becomes NULL, invalid JSON is stored as a JSON string, NaN in JSON
becomes null. One bad value never takes its row, its run or another run down.
"""
from __future__ import annotations

import json
import math
from datetime import datetime
from typing import Any, Optional

import pyarrow as pa

from functools import partial

from ...surrogates import storable
from ...text import clip

_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
MAX_NOTES = 20  # per run: the first distinct notes, then a count


def storable_value(value: Any, nul: bool = False) -> tuple[Any, list[str]]:
    """A JSON-able value with its text made storable (`nul`: NUL characters escaped too) and non-finite
    floats made null, and what changed."""
    changes: list[str] = []

    def walk(v: Any) -> Any:
        if isinstance(v, str):
            fixed, note = storable(v, nul)
            if fixed is not None:
                changes.append(note)  # type: ignore[arg-type]
                return fixed
            return v
        if isinstance(v, float) and not math.isfinite(v):
            changes.append(f"{v} (not valid JSON) stored as null")
            return None
        if isinstance(v, dict):
            return {walk(str(k)): walk(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [walk(x) for x in v]
        return v

    return walk(value), changes


class Cleaner:
    """Checks every value of a batch against its column's type; keeps notes per run."""

    def __init__(self, nul: bool = False) -> None:
        self.notes: dict[str, dict[str, int]] = {}
        self.nul = nul  # NUL characters are escaped too (PostgreSQL text cannot hold them)

    def note(self, run_id: Any, text: str) -> None:
        if isinstance(run_id, str):
            notes = self.notes.setdefault(run_id, {})
            notes[text] = notes.get(text, 0) + 1

    def rendered(self) -> dict[str, list[str]]:
        """run id → its notes, one line each ("… (3 values)" for repeats)."""
        out = {}
        for run_id, notes in self.notes.items():
            lines = [f"{text} ({n} values)" if n > 1 else text for text, n in notes.items()]
            if len(lines) > MAX_NOTES:
                lines = lines[:MAX_NOTES] + [f"and {len(lines) - MAX_NOTES} more notes"]
            out[run_id] = lines
        return out

    def one(self, run_id: str, where: str, fix: str, value: Any) -> Any:
        """One value bound as a statement parameter (`fix`: "text", "json" or "texts"), made storable."""
        fixed, problem = {"text": _fix_text, "json": _fix_json, "texts": _fix_text_list}[fix](value, self.nul)
        if problem is not None:
            self.note(run_id, f"{where}: {problem}")
        return fixed

    def column(self, table: str, name: str, kind: pa.DataType, is_json: bool, values: list[Any],
               run_ids: list[Any], steps: Optional[list[Any]]) -> pa.Array:
        """The column as an Arrow array, each value made storable (and noted) where it was not."""
        if is_json:
            fix = partial(_fix_json, nul=self.nul)
        elif pa.types.is_list(kind):
            fix = _fix_embedding if kind.value_type == pa.float32() else partial(_fix_text_list, nul=self.nul)
        else:
            fix = _FIXERS.get(kind) or partial(_fix_text, nul=self.nul)
        out = []
        for i, value in enumerate(values):
            fixed, problem = fix(value)
            if problem is not None:
                step = steps[i] if steps is not None else None
                where = f"{table}.{name}" + (f" of step {step}" if step is not None else "")
                self.note(run_ids[i], f"{where}: {problem}")
            out.append(fixed)
        return pa.array(out, type=kind)


def _shown(value: Any) -> str:
    return clip(repr(value), 60)


def _fix_text(value: Any, nul: bool = False) -> tuple[Any, Optional[str]]:
    if value is None:
        return None, None
    if not isinstance(value, str):
        kind = type(value).__name__
        text = str(value)
        fixed, _ = storable(text, nul)
        return (fixed if fixed is not None else text), f"a {kind} where text belongs, stored as text"
    fixed, note = storable(value, nul)
    return (value, None) if fixed is None else (fixed, note)


def _fix_text_list(value: Any, nul: bool = False) -> tuple[Any, Optional[str]]:
    if value is None:
        return None, None
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    problems = []
    out = []
    for item in items:
        fixed, problem = _fix_text(item, nul)
        out.append(fixed)
        if problem is not None:
            problems.append(problem)
    return out, (problems[0] if problems else None)


def _integer(value: Any, bounds: tuple[int, int], sql: str) -> tuple[Any, Optional[str]]:
    if value is None:
        return None, None
    number: Any = value
    if isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str):
        try:
            number = int(value.strip())
        except ValueError:
            return None, f"{_shown(value)} is not a whole number; stored NULL"
    if isinstance(number, bool) or not isinstance(number, int):
        return None, f"{_shown(value)} is not a whole number; stored NULL"
    if not bounds[0] <= number <= bounds[1]:
        return None, f"{number} is out of range for {sql} ({bounds[0]}..{bounds[1]}); stored NULL"
    return number, (None if number is value else f"{_shown(value)} stored as {number}")


def _fix_int(value: Any) -> tuple[Any, Optional[str]]:
    return _integer(value, _INT32, "INTEGER")


def _fix_timestamp(value: Any) -> tuple[Any, Optional[str]]:
    if isinstance(value, datetime):
        return value, None
    return _integer(value, _INT64, "a nanosecond timestamp")


def _fix_float(value: Any) -> tuple[Any, Optional[str]]:
    if value is None or (isinstance(value, float)):
        return value, None
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value), None
        except OverflowError:
            return None, f"{value} is out of range for DOUBLE; stored NULL"
    try:
        return float(value), f"{_shown(value)} stored as a number"
    except (TypeError, ValueError, OverflowError):
        return None, f"{_shown(value)} is not a number; stored NULL"


def _fix_json(value: Any, nul: bool = False) -> tuple[Any, Optional[str]]:
    if value is None:
        return None, None
    if not isinstance(value, str):  # rows normally arrive as text already (batch.extra_row)
        fixed, changes = storable_value(value, nul)
        return json.dumps(fixed, default=str, ensure_ascii=False), (changes[0] if changes else None)
    try:
        parsed = json.loads(value)
    except ValueError:
        text, _ = storable(value, nul)
        return json.dumps(text if text is not None else value, ensure_ascii=False), \
            "not valid JSON; stored as a JSON string"
    fixed, changes = storable_value(parsed, nul)
    if not changes:
        return value, None
    return json.dumps(fixed, ensure_ascii=False, separators=(",", ":")), changes[0]


def _fix_embedding(value: Any) -> tuple[Any, Optional[str]]:
    if value is None:
        return None, None
    try:
        pa.array([value], type=pa.list_(pa.float32()))
        return value, None
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return None, f"{_shown(value)} is not a list of numbers; stored NULL"


def _fix_bool(value: Any) -> tuple[Any, Optional[str]]:
    if value is None or isinstance(value, bool):
        return value, None
    return None, f"{_shown(value)} is not true or false, stored NULL"


_FIXERS = {pa.int32(): _fix_int, pa.float64(): _fix_float,
           pa.timestamp("ns"): _fix_timestamp, pa.bool_(): _fix_bool}
