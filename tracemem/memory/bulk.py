"""Many new memory records at once: the same checks, records, rows and event JSON as one at a time, cheaper.

Why: `remember_many` of 5,000 records spent about 19 µs per record in Python before
DuckDB saw a row, most of it not in the checks but in re-reading each pydantic
record field by field (the table row) and in dumping its audit view to sorted JSON
(the `memory_events.new` text). Records of one call share almost every field (the
subject, the clock, the embedder, the defaults): `EventJSON` serializes each distinct
combination of those once, through the reference path (`audit_view` and
`sql.event_json`), and splices each record's own id and text into it with the JSON
encoder's own string function. The text is byte for byte what `event_json(rec.audit_view())`
gives (tests compare them on awkward values).
"""

from __future__ import annotations

import gc
import json
from contextlib import contextmanager
from datetime import datetime
from operator import itemgetter
from typing import Any, Callable, Iterator, Sequence

from .errors import MemoryInputError
from .records import MemoryRecord, as_tags, check_fields, check_subject, check_window
from .tables import MEMORY_COLUMNS
from ..ids import new_id

__all__ = ["ALLOWED_FIELDS", "new_records", "rows_of", "EventJSON", "cyclic_gc_paused", "GC_PAUSE_ROWS"]

GC_PAUSE_ROWS = 1_000

# What an item of remember_many may hold besides its subject.
ALLOWED_FIELDS = frozenset({"text", "tags", "confidence", "valid_from", "valid_until", "source_run_id",
                            "source_step", "source_ref", "review_state"})
_ROW = itemgetter(*MEMORY_COLUMNS)
_OTHERS = tuple(c for c in MEMORY_COLUMNS if c not in ("memory_id", "text"))
_KEY = itemgetter(*_OTHERS)
_CONF = _OTHERS.index("confidence")
# Stand-ins for a record's id and text while its template is serialized (NULs: no real id has them).
_MID = "\x00tracemem-bulk-memory-id\x00"
_TEXT = "\x00tracemem-bulk-text\x00"
_encode: Callable[[str], str] = json.encoder.encode_basestring_ascii  # type: ignore[attr-defined]


def new_records(pairs: Sequence[tuple[Any, dict[str, Any]]], *, now: datetime | None,
                embedder_id: str | None) -> list[MemoryRecord]:
    """Check and build the records of (subject, fields) pairs, in order; the first bad item raises."""
    recs: list[MemoryRecord] = []
    append = recs.append
    for subject, item in pairs:
        if not ALLOWED_FIELDS.issuperset(item):
            unknown = set(item) - ALLOWED_FIELDS
            raise MemoryInputError(f"unknown memory fields {sorted(unknown)}; allowed: {sorted(ALLOWED_FIELDS)}")
        item.setdefault("confidence", 60)
        item.setdefault("review_state", "fresh")
        item["tags"] = as_tags(item.get("tags"))
        fields = check_fields(item)
        check_window(fields.get("valid_from"), fields.get("valid_until"))
        append(MemoryRecord(memory_id=f"m_{new_id()}", subject=check_subject(subject), embedder_id=embedder_id,
                            created_at=now, updated_at=now, **fields))
    return recs


def rows_of(recs: Sequence[MemoryRecord]) -> list[tuple[Any, ...]]:
    """The records as MEMORY_COLUMNS tuples (what `tuple(getattr(rec, c) for c in MEMORY_COLUMNS)` gives)."""
    return [_ROW(r.__dict__) for r in recs]


class EventJSON:
    """The `new` JSON of `remember` events, one template per combination of the fields other than id and text."""

    def __init__(self, dumps: Callable[[dict[str, Any] | None], str | None]) -> None:
        self.dumps = dumps  # the reference serializer (memory/sql.py event_json)
        self.templates: dict[tuple[Any, ...], tuple[str, str, str] | None] = {}
        self.calls = 0

    def __call__(self, rec: MemoryRecord) -> str:
        self.calls += 1
        if len(self.templates) > 32 and 2 * len(self.templates) > self.calls:  # few records share one: no gain
            out = self.dumps(rec.audit_view())
            assert out is not None
            return out
        d = rec.__dict__
        key = _KEY(d)
        if key[_CONF] == 0:  # -0.0 == 0.0 but they print differently
            key = (*key, str(key[_CONF]))
        parts = self.templates.get(key, False)
        if parts is False:
            parts = self.templates[key] = self._template(rec)
        if parts is None:  # a value collided with a stand-in: the reference path, for this record
            out = self.dumps(rec.audit_view())
            assert out is not None
            return out
        return parts[0] + _encode(d["memory_id"]) + parts[1] + _encode(d["text"]) + parts[2]

    def _template(self, rec: MemoryRecord) -> tuple[str, str, str] | None:
        text = self.dumps(rec.model_copy(update={"memory_id": _MID, "text": _TEXT}).audit_view())
        assert text is not None
        mid, txt = _encode(_MID), _encode(_TEXT)
        if text.count(mid) != 1 or text.count(txt) != 1 or text.index(mid) > text.index(txt):
            return None
        head, rest = text.split(mid)
        middle, tail = rest.split(txt)
        return head, middle, tail


@contextmanager
def cyclic_gc_paused(rows: int) -> Iterator[None]:
    """Pause Python's cyclic garbage collector while `rows` (>= GC_PAUSE_ROWS) records are written.

    Why: a batch of 5,000 allocates some 50,000 short-lived containers (items, records,
    rows, events), which set off ~70 collections per batch, and every few batches a full
    one that walks the whole index; together about a tenth of a bulk insert's time.
    Reference counting still frees all of them as usual; only the search for reference
    cycles waits until the batch is written. The collector's previous state comes back
    (a caller that disabled it keeps it disabled).
    """
    if rows < GC_PAUSE_ROWS or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
