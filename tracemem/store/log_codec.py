"""Journal entries as bytes: a stage's (or a run's) record tuples, encoded in about a microsecond.

Why: the journal (`segment_log`) appends one entry per finished stage, so encoding is on
the hot path beside one append (a memory copy, segment_log); `json.dumps` of a step entry
costs 3–4 µs here, more than the append. An entry is a compact JSON array, so it stays readable with any JSON tool and
decodes with the standard library:

    [1, kind, run_id, steps, reads, writes, run, end]      + `, free` when there is any

- kind: "begin" (a run started: its runs row), "step" (a finished stage), "end" (a run
  ended: its end facts), "run" (a whole run at once, for `flush_interval=0`).
- steps, reads, writes: `Step`/`Read`/`Write` field lists; run: the runs row or null;
  end: the end facts or null. These hold only ints, floats, strings and nulls, and go
  through orjson when it is installed (0.5 µs), else the standard library's C encoder
  (2.5 µs); both write the same JSON. Anything else is refused with a `CodecError`.
- free: an object with "decisions" and "rows" (a stage's extra table rows;
  "_"-prefixed telemetry rows are not journaled). Free-form values (decision evidence,
  row values) are encoded by the standard library with `default=str`, as the store
  writes them, so the bytes never depend on orjson.

`decode` never executes or imports anything (no pickle, no marshal): it parses JSON and
checks every field's type, raising `CodecError` that names the field on anything else, so
corrupt or hostile bytes that pass the journal's checksum still cannot be applied.
"""
from __future__ import annotations

import json
from json import encoder as json_encoder
from typing import Any, Callable, Iterable, NamedTuple, Optional, Sequence

from ..errors import TracememError
from ..record import Decision, Read, Step, Write
from .batch import GIVEN, S, json_text

VERSION = 1
KINDS = ("begin", "step", "end", "run")


class CodecError(TracememError, ValueError):
    """Bytes that are not a journal entry this tracemem can apply."""


class Entry(NamedTuple):
    """A decoded journal entry: the same tuples the runner handed in."""

    kind: str
    run_id: str
    steps: list[Step]
    reads: list[Read]
    writes: list[Write]
    decisions: list[Decision]
    rows: list[tuple[str, dict[str, Any]]]
    run: Optional[tuple]  # the runs row ("begin", "run")
    end: Optional[dict[str, Any]]  # what the runs row learns when the run ends ("end")


def _plain_tuple(value: Any) -> tuple:
    if isinstance(value, tuple):  # a NamedTuple (a record, or inside a field), which orjson does not take as it is
        return value[:]  # (its fields as a plain tuple)
    return _refuse(value)


def _refuse(value: Any) -> Any:
    raise TypeError(f"{type(value).__name__} is not a journal field type")


def _stdlib_dumps() -> Callable[[Any], bytes]:
    make = json_encoder.c_make_encoder
    if make is None:  # a Python without the C accelerator
        return lambda value: json.dumps(value, separators=(",", ":")).encode()
    encode = make(None, _refuse, json_encoder.encode_basestring_ascii, None, ":", ",", False, False, True)
    return lambda value: "".join(encode(value, 0)).encode()


def _orjson_dumps() -> Optional[Callable[[Any], bytes]]:
    try:
        import orjson
    except ImportError:
        return None
    dumps, fallback = orjson.dumps, _stdlib_dumps()

    options = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS  # refused, as by the stdlib

    def fast(value: Any) -> bytes:
        try:
            return dumps(value, default=_plain_tuple, option=options)
        except TypeError:  # lone surrogates, ints beyond 64 bits: the standard library writes those
            return fallback(value)
    return fast


def as_text(value: Any) -> str:
    """A value as the store writes it (`str`), or what it is when even that fails: never raises."""
    try:
        return str(value)
    except Exception as err:  # noqa: BLE001 - an object whose __str__ raises must not stop the run
        return f"<{type(value).__name__}: str() raised {type(err).__name__}>"


TEXT_COLUMNS: dict[str, frozenset[str]] = {t: frozenset(c for c, kind in cols if kind == S)
                                           for t, cols in GIVEN.items()}
_JSON_TYPES = frozenset({str, int, float, bool, type(None), dict, list, tuple})


def _as_stored(table: str, row: dict[str, Any]) -> dict[str, Any]:
    """The row with a text column's odd value (bytes, a datetime, an enum member: no JSON type) already the
    JSON text the store writes for it. Journaled as its `str()`, it would come back a str, which the store
    keeps as it is: not what it writes from the live row."""
    odd = [c for c, v in row.items() if type(v) not in _JSON_TYPES]
    if not odd:
        return row
    text = TEXT_COLUMNS.get(table, frozenset())
    return {c: _stored_text(v) if c in text and c in odd else v for c, v in row.items()}


def _stored_text(value: Any) -> Any:
    try:
        return json_text(value)
    except Exception:  # noqa: BLE001 - a value whose __str__ raises: left to `as_text`, which says so
        return value


def _free_json(decisions: Sequence[Decision], rows: Sequence[tuple[str, dict[str, Any]]]) -> Optional[bytes]:
    """The free-form part: decisions (with their evidence) and extra table rows, telemetry rows left out."""
    if not decisions and not rows:  # most runs of a plain pipeline: nothing to build
        return None
    free: dict[str, Any] = {}
    kept_decisions = [tuple(d) for d in decisions]
    if kept_decisions:
        free["decisions"] = kept_decisions
    kept_rows = [(t, _as_stored(t, r)) for t, r in rows if not t.startswith("_")]
    if kept_rows:
        free["rows"] = kept_rows
    return json.dumps(free, default=as_text, separators=(",", ":")).encode() if free else None


class LogCodec:
    """Encoders for the four entry kinds. `fast`: use orjson (None: if it is installed)."""

    def __init__(self, fast: Optional[bool] = None) -> None:
        dumps = _orjson_dumps() if fast is not False else None
        if fast and dumps is None:
            raise CodecError("LogCodec(fast=True) needs orjson: pip install orjson")
        self.fast = dumps is not None
        self._dumps: Callable[[Any], bytes] = dumps or _stdlib_dumps()

    def _entry(self, kind: str, run_id: str, steps: Sequence[Step] = (), reads: Sequence[Read] = (),
               writes: Sequence[Write] = (), run: Optional[Sequence[Any]] = None,
               end: Optional[dict[str, Any]] = None, free: Optional[bytes] = None) -> bytes:
        try:
            # plain tuples, as the runner records them (run.Records); a NamedTuple among them (a run's records
            # named by `run.steps` before it ended) costs orjson a call back into Python (`_plain_tuple`)
            head = self._dumps((VERSION, kind, run_id, steps, reads, writes, run, end))
        except (TypeError, ValueError) as e:
            raise CodecError(f"cannot journal the {kind} entry of run {run_id}: {e}; steps, reads, writes, "
                             f"the runs row and end facts hold only ints, floats, strings and None") from e
        return head if free is None else b"%s,%s]" % (head[:-1], free)

    def step(self, run_id: str, step: Step, reads: Sequence[Read], writes: Sequence[Write],
             decision: Optional[Decision], rows: Iterable[tuple[str, dict[str, Any]]]) -> bytes:
        """A finished stage: what `Sink.step_done` receives."""
        free = _free_json([decision] if decision is not None else (), rows) if decision or rows else None
        return self._entry("step", run_id, (step,), reads, writes, free=free)

    def part(self, run_id: str, steps: Sequence[Step], reads: Sequence[Read], writes: Sequence[Write],
             decisions: Sequence[Decision], rows: Iterable[tuple[str, dict[str, Any]]]) -> bytes:
        """Several finished stages in one "step" entry (what a resumed run added)."""
        return self._entry("step", run_id, steps, reads, writes, free=_free_json(decisions, rows))

    def begin(self, run_row: Sequence[Any]) -> bytes:
        """A run started (durability "stage"): its runs row; its first field is the run id."""
        return self._entry("begin", run_row[0], run=run_row)

    def end(self, run_id: str, facts: dict[str, Any]) -> bytes:
        """A run ended: the facts its runs row learns (status, error, ended_at, output, ...)."""
        return self._entry("end", run_id, end=facts)

    def run(self, run_row: Sequence[Any], steps: Sequence[Step], reads: Sequence[Read], writes: Sequence[Write],
            decisions: Sequence[Decision], rows: Iterable[tuple[str, dict[str, Any]]]) -> bytes:
        """A whole finished run in one entry (`flush_interval=0`)."""
        return self._entry("run", run_row[0], steps, reads, writes, run_row, free=_free_json(decisions, rows))


# -- decoding: parse, then check every field -------------------------------------------------

_OPT = object()  # marks "or None" in a field spec
STEP_SPEC = (int, str, str, str, int, str, (str, _OPT), int, int, (int, _OPT), (str, _OPT), list)
READ_SPEC = (int, int, str, (int, _OPT), (int, _OPT))
WRITE_SPEC = (int, int, str, str, (str, _OPT))
_SCALARS = (str, int, float, bool, type(None))  # exact types: a JSON parser makes nothing else


def _scalar(value: Any) -> bool:
    """A scalar, or a list of strings (a run's notes)."""
    return type(value) in _SCALARS or (type(value) is list and all(type(v) is str for v in value))


def _fail(where: str, want: str, got: Any) -> CodecError:
    return CodecError(f"corrupt journal entry: {where} should be {want}, got {type(got).__name__} {got!r:.60}")


def _fields(items: Any, spec: tuple, where: str) -> list[list[Any]]:
    if type(items) is not list:
        raise _fail(where, "a list", items)
    for i, item in enumerate(items):
        if type(item) is not list or len(item) != len(spec):
            raise _fail(f"{where}[{i}]", f"a list of {len(spec)} fields", item)
        for j, (value, want) in enumerate(zip(item, spec)):
            kinds = want if isinstance(want, tuple) else (want,)
            if not (type(value) in kinds or (value is None and _OPT in kinds)):
                raise _fail(f"{where}[{i}][{j}]", " or ".join(k.__name__ if k is not _OPT else "null"
                                                              for k in kinds), value)
    return items


def _scalars(value: Any, where: str, container: type) -> Any:
    if value is None:
        return None
    if type(value) is not container or not all(_scalar(v)
                                               for v in (value if container is list else value.values())):
        raise _fail(where, f"null or a {container.__name__} of scalars (or lists of strings)", value)
    return value


def _free(value: Any) -> dict[str, Any]:
    if type(value) is not dict or not set(value) <= {"decisions", "rows"}:
        raise _fail("free", 'an object with keys "decisions", "rows"', value)
    for i, d in enumerate(value.get("decisions", [])):
        if type(d) is not list or len(d) != 3 or type(d[0]) is not int or type(d[1]) is not str:
            raise _fail(f"free.decisions[{i}]", "[step, chosen, evidence]", d)
    for i, r in enumerate(value.get("rows", [])):
        if type(r) is not list or len(r) != 2 or type(r[0]) is not str or type(r[1]) is not dict:
            raise _fail(f"free.rows[{i}]", "[table, row object]", r)
    return value


def records(entries: Iterable[bytes]) -> tuple[list[Step], list[Read], list[Write]]:
    """The steps, reads and writes that a run's journal entries hold, in order (`decode` each)."""
    steps: list[Step] = []
    reads: list[Read] = []
    writes: list[Write] = []
    for entry in map(decode, entries):
        steps += entry.steps
        reads += entry.reads
        writes += entry.writes
    return steps, reads, writes


def decode(data: bytes) -> Entry:
    """The entry `data` holds; `CodecError` if it is not one (nothing in it is executed)."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise CodecError(f"corrupt journal entry: not JSON ({e})") from None
    if type(doc) is not list or len(doc) not in (8, 9):
        raise _fail("the entry", "a list of 8 or 9 items", doc)
    if doc[0] != VERSION or type(doc[0]) is not int:
        raise CodecError(f"journal entry version {doc[0]!r:.20}; this tracemem reads version {VERSION}")
    if doc[1] not in KINDS:
        raise _fail("kind", " or ".join(KINDS), doc[1])
    if type(doc[2]) is not str:
        raise _fail("run_id", "str", doc[2])
    steps = _fields(doc[3], STEP_SPEC, "steps")
    for i, s in enumerate(steps):
        if not all(type(line) is str for line in s[11]):
            raise _fail(f"steps[{i}][11]", "a list of log lines", s[11])
    run = _scalars(doc[6], "run", list)
    free = _free(doc[8]) if len(doc) == 9 else {}
    return Entry(doc[1], doc[2],
                 [Step(*s[:11], tuple(s[11])) for s in steps],
                 [Read(*r) for r in _fields(doc[4], READ_SPEC, "reads")],
                 [Write(*w) for w in _fields(doc[5], WRITE_SPEC, "writes")],
                 [Decision(*d) for d in free.get("decisions", [])],
                 [(t, r) for t, r in free.get("rows", [])],
                 tuple(run) if run is not None else None,
                 _scalars(doc[7], "end", dict))
