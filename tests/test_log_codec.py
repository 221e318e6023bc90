"""Journal entries: every kind round-trips to the same tuples, with orjson or without, and bad bytes
raise CodecError (never anything else, never a half-built entry)."""
from __future__ import annotations

import enum
import importlib.util
import json
import random
from datetime import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracemem.record import Decision, Read, Step, Write
from tracemem.store.batch import extra_row
from tracemem.store.log_codec import CodecError, Entry, LogCodec, decode

HAS_ORJSON = importlib.util.find_spec("orjson") is not None
CODECS = [pytest.param(False, id="stdlib"),
          pytest.param(True, id="orjson", marks=pytest.mark.skipif(not HAS_ORJSON, reason="orjson not installed"))]

STEP = Step(4, "stage_3", "stage_3", "stage", 0, "ok", None, 1796065667107025049, 1796065667107056666, None)
READS = [Read(4, 1, "f3", 2, 3), Read(4, 2, "f4", None, None)]
WRITES = [Write(4, 3, "f0", "set", "5"), Write(4, 4, "items", "delete", None)]
RUN_ROW = ("run-1", "chat", "abc123", "running", None, 1796065667107025049, None, '{"q": 1}', None, None, None,
           4242, "host", "alice", None, None, None)


@pytest.mark.parametrize("fast", CODECS)
def test_every_kind_round_trips(fast: bool) -> None:
    codec = LogCodec(fast)
    step = STEP._replace(error="boom: ünïcödé \u2028", logs=("one", "two"), child_run_id="child", routed_by=2)
    decision = Decision(4, "left", {"rules": [{"name": "r1", "passed": True, "score": 0.5}]})
    rows = [("model_calls", {"model": "m", "latency_ms": 1.5, "input_tokens": 3}), ("_span", {"x": 1})]

    e = decode(codec.step("run-1", step, READS, WRITES, decision, rows))
    assert e == Entry("step", "run-1", [step], READS, WRITES, [decision], rows[:1], None, None)
    assert type(e.steps[0].logs) is tuple

    bare = decode(codec.step("run-1", STEP, [], [], None, []))
    assert (bare.steps, bare.reads, bare.writes, bare.decisions, bare.rows) == ([STEP], [], [], [], [])

    assert decode(codec.begin(RUN_ROW)) == Entry("begin", "run-1", [], [], [], [], [], RUN_ROW, None)
    facts = {"status": "ok", "error": None, "ended_at": 1796065667107099999, "output": '{"a": 1}',
             "query": None, "trace_id": None}
    assert decode(codec.end("run-1", facts)) == Entry("end", "run-1", [], [], [], [], [], None, facts)

    whole = decode(codec.run(RUN_ROW, [STEP, step], READS, WRITES, [decision], rows))
    assert whole == Entry("run", "run-1", [STEP, step], READS, WRITES, [decision], rows[:1], RUN_ROW, None)


@pytest.mark.skipif(not HAS_ORJSON, reason="orjson not installed")
def test_both_encoders_decode_to_the_same_entry() -> None:
    args = ("run-1", STEP._replace(error="\udc80 lone surrogate"), READS, WRITES, Decision(4, "x", [1]),
            [("memory_uses", {"memory_id": "m1"})])
    fast, slow = LogCodec(True).step(*args), LogCodec(False).step(*args)
    assert decode(fast) == decode(slow)
    assert LogCodec().fast is True


def test_unencodable_fields_are_refused_by_name() -> None:
    for fast in [False] + ([True] if HAS_ORJSON else []):
        with pytest.raises(CodecError, match="step entry of run run-1.*set is not a journal field type"):
            LogCodec(fast).step("run-1", STEP._replace(error={1, 2}), [], [], None, [])
        with pytest.raises(CodecError, match="end entry of run run-1.*datetime is not a journal field type"):
            LogCodec(fast).end("run-1", {"ended_at": datetime.now()})


def test_free_form_values_are_written_as_the_store_writes_them() -> None:
    class Odd:
        def __str__(self) -> str:
            return "odd!"
    e = decode(LogCodec(False).step("r", STEP, [], [], Decision(4, "x", {"o": Odd()}), []))
    assert e.decisions[0].evidence == {"o": "odd!"}


@pytest.mark.parametrize("value", [b"bytes", datetime(2026, 12, 1, 9, 30), enum.Enum("Color", "RED").RED, 7, 2.5,
                                   True, None, "text", {"at": datetime(2026, 12, 1)}, [1, "two"], (3, 4)],
                         ids=lambda v: type(v).__name__)
def test_a_journaled_row_is_stored_as_the_live_row_would_be(value: object) -> None:
    """Recovery stores what the writer stores: a text column's value that is no JSON type is its JSON
    text either way (journaled as its str(), it came back as a bare str, stored without the quotes)."""
    row = {"run_id": "r", "step": 1, "call_id": "c", "name": "t", "result": value, "arguments": value}
    for fast in (False, True):
        entry = decode(LogCodec(fast).step("r", STEP, [], [], None, [("tool_calls", row)]))
        assert [extra_row(t, r) for t, r in entry.rows] == [extra_row("tool_calls", row)]


@pytest.mark.parametrize("data, match", [
    (b"", "not JSON"),
    (b"\xff\xfe", "not JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "not JSON"),
    (b'{"a": 1}', "a list of 8 or 9 items"),
    (b'[1,"step","r",[],[],[]]', "a list of 8 or 9 items"),
    (b'[2,"step","r",[],[],[],null,null]', "version 2"),
    (b'[true,"step","r",[],[],[],null,null]', "version True"),
    (b'[1,"exec","r",[],[],[],null,null]', "kind should be"),
    (b'[1,"step",7,[],[],[],null,null]', "run_id should be str"),
    (b'[1,"step","r",[[1]],[],[],null,null]', r"steps\[0\] should be a list of 12 fields"),
    (b'[1,"step","r",[],[[1,2,"p",null,"x"]],[],null,null]', r"reads\[0\]\[4\] should be int or null"),
    (b'[1,"step","r",[],[],[[1,true,"p","set",null]],null,null]', r"writes\[0\]\[1\] should be int"),
    (b'[1,"step","r",[[1,"s","s","stage",0,"ok",null,1,2,null,null,[3]]],[],[],null,null]', r"steps\[0\]\[11\]"),
    (b'[1,"step","r",[],[],[],null,null,{"code":"x"}]', "free should be"),
    (b'[1,"step","r",[],[],[],null,null,{"rows":[["t",[1]]]}]', r"free.rows\[0\]"),
    (b'[1,"step","r",[],[],[],null,null,{"decisions":[["1","x",null]]}]', r"free.decisions\[0\]"),
    (b'[1,"begin","r",[],[],[],[{"x":1}],null]', "run should be null or a list of scalars"),
    (b'[1,"begin","r",[],[],[],{"x":1},null]', "run should be"),
    (b'[1,"end","r",[],[],[],null,{"status":[1]}]', "end should be null or a dict of scalars"),
])
def test_bad_entries_raise_codec_error_naming_the_field(data: bytes, match: str) -> None:
    with pytest.raises(CodecError, match=match):
        decode(data)
    assert issubclass(CodecError, ValueError)


def test_corrupted_bytes_decode_or_raise_codec_error_only() -> None:
    """What the checksum cannot catch (a hostile writer) still only ever gives an Entry or a CodecError."""
    good = LogCodec(False).run(RUN_ROW, [STEP], READS, WRITES, [Decision(4, "x", {"a": 1})],
                               [("model_calls", {"model": "m"})])
    rng = random.Random(7)
    outcomes = {"entry": 0, "error": 0}
    for _ in range(3000):
        bad = bytearray(good)
        for _ in range(rng.randint(1, 3)):
            bad[rng.randrange(len(bad))] = rng.randrange(256)
        cut = bytes(bad[:rng.randint(0, len(bad))]) if rng.random() < 0.3 else bytes(bad)
        try:
            e = decode(cut)
        except CodecError:
            outcomes["error"] += 1
            continue
        assert all(type(s) is Step for s in e.steps) and all(type(r) is Read for r in e.reads)
        outcomes["entry"] += 1
    assert outcomes["error"] > 0 and outcomes["entry"] > 0


text = st.text(max_size=40)
opt_text = st.none() | text
ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)
opt_int = st.none() | ints
steps = st.builds(Step, ints, text, text, text, ints, text, opt_text, ints, ints, opt_int, opt_text,
                  st.lists(text, max_size=3).map(tuple))
reads = st.builds(Read, ints, ints, text, opt_int, opt_int)
writes = st.builds(Write, ints, ints, text, text, opt_text)
json_values = st.recursive(st.none() | st.booleans() | ints | text | st.floats(allow_nan=False),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
                           max_leaves=8)


@settings(max_examples=150, deadline=None)
@given(step=steps, rs=st.lists(reads, max_size=4), ws=st.lists(writes, max_size=4),
       decision=st.none() | st.builds(Decision, ints, text, json_values))
def test_any_step_round_trips_through_both_encoders(step: Step, rs: list[Read], ws: list[Write],
                                                    decision: Decision | None) -> None:
    for fast in [False] + ([True] if HAS_ORJSON else []):
        e = decode(LogCodec(fast).step("run", step, rs, ws, decision, []))
        assert e.steps == [step] and e.reads == rs and e.writes == ws
        assert e.decisions == ([decision] if decision else [])
        json.dumps(e.decisions and e.decisions[0].evidence)  # evidence is plain JSON again
