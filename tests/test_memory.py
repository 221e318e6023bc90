"""Memory records: the API, every logged change, and the input rules."""

from __future__ import annotations

import json
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import duckdb
import numpy as np
import pytest

from tracemem.memory import (MEMORY_DDL, EmbedderMismatchError, HashingEmbedder, Memory, MemoryInputError,
                             MemoryNotFoundError, MemoryRecord)

T0 = datetime(2025, 1, 1, 12, 0, 0)


class Clock:
    """A settable clock so tests control created_at/updated_at and validity."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=1)
        return self.now


@pytest.fixture
def con() -> duckdb.DuckDBPyConnection:
    c = duckdb.connect(":memory:")
    c.execute("CREATE TABLE IF NOT EXISTS tracemem_meta (key VARCHAR PRIMARY KEY, value VARCHAR)")
    for stmt in MEMORY_DDL:
        c.execute(stmt)
    return c


@pytest.fixture
def mem(con: duckdb.DuckDBPyConnection) -> Memory:
    return Memory(con, threading.RLock(), clock=Clock())


def events(mem: Memory, mid: str) -> list[str]:
    return [e.event for e in mem.history(mid)]


# -- the tables -----------------------------------------------------------------------
def test_ddl_is_idempotent_and_has_the_public_columns(con: duckdb.DuckDBPyConnection) -> None:
    for stmt in MEMORY_DDL:
        con.execute(stmt)  # second run: no error
    cols = {r[0] for r in con.execute("DESCRIBE memories").fetchall()}
    assert {"memory_id", "subject", "text", "tags", "confidence", "review_state", "valid_from", "valid_until",
            "source_run_id", "source_step", "source_ref", "embedder_id", "embedding", "created_at", "updated_at",
            "deleted_at", "superseded_by"} <= cols
    ev_cols = {r[0] for r in con.execute("DESCRIBE memory_events").fetchall()}
    assert {"event_id", "memory_id", "event", "old", "new", "run_id", "at", "reason"} <= ev_cols


def test_memory_works_on_a_bare_connection() -> None:
    m = Memory(duckdb.connect(":memory:"))
    assert m.search("u", "anything").no_match


# -- remember / get ---------------------------------------------------------------------
def test_remember_defaults_and_provenance(mem: Memory, con: duckdb.DuckDBPyConnection) -> None:
    rec = mem.remember("u1", "User is vegetarian", tags=["diet"], source_run_id="r1", source_step=3,
                       source_ref="turn-9", run_id="r1")
    assert isinstance(rec, MemoryRecord)
    assert (rec.confidence, rec.review_state, rec.tags) == (60, "fresh", ("diet",))
    assert mem.get(rec.memory_id) == rec
    row = con.execute("SELECT subject, source_run_id, source_step, source_ref, embedder_id, len(embedding) "
                      "FROM memories").fetchone()
    assert row == ("u1", "r1", 3, "turn-9", mem.embedder.embedder_id, mem.embedder.dim)
    (ev,) = mem.history(rec.memory_id)
    assert (ev.event, ev.run_id, ev.old, ev.new["text"]) == ("remember", "r1", None, "User is vegetarian")
    meta = dict(con.execute("SELECT key, value FROM tracemem_meta").fetchall())
    assert meta["memory.embedder_id"] == mem.embedder.embedder_id and meta["memory.dim"] == "384"


def test_remember_many_is_one_insert_with_events(mem: Memory) -> None:
    recs = mem.remember_many([{"subject": "u", "text": f"fact number {i}", "confidence": 70} for i in range(50)],
                             run_id="bulk")
    assert len(recs) == 50 and len({r.memory_id for r in recs}) == 50
    assert len(mem.list("u")) == 50
    assert all(events(mem, r.memory_id) == ["remember"] for r in recs[:5])
    assert mem.search("u", "number 7").records[0].text == "fact number 7"


def test_get_unknown_id(mem: Memory) -> None:
    with pytest.raises(MemoryNotFoundError, match="no memory 'nope'"):
        mem.get("nope")
    with pytest.raises(MemoryNotFoundError):
        mem.history("nope")


# -- bad input ---------------------------------------------------------------------------
@pytest.mark.parametrize("confidence", [-1, 100.5, 101, float("nan"), "high", None, True])
def test_confidence_out_of_range(mem: Memory, confidence: object) -> None:
    with pytest.raises(MemoryInputError, match="confidence"):
        mem.remember("u", "x fact", confidence=confidence)  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["", "   \n", None, 42])
def test_empty_text(mem: Memory, text: object) -> None:
    with pytest.raises(MemoryInputError, match="text"):
        mem.remember("u", text)  # type: ignore[arg-type]


def test_window_end_before_start(mem: Memory) -> None:
    with pytest.raises(MemoryInputError, match="ends before it starts"):
        mem.remember("u", "x", valid_from=T0, valid_until=T0 - timedelta(days=1))
    with pytest.raises(MemoryInputError, match="ends before it starts"):
        mem.remember("u", "x", valid_from=T0, valid_until=T0)  # empty window
    rec = mem.remember("u", "x", valid_from=T0)
    with pytest.raises(MemoryInputError, match="ends before it starts"):
        mem.update(rec.memory_id, valid_until=T0 - timedelta(seconds=1))


def test_other_bad_fields(mem: Memory) -> None:
    with pytest.raises(MemoryInputError, match="subject"):
        mem.remember("", "x")
    with pytest.raises(MemoryInputError, match="tags"):
        mem.remember("u", "x", tags="diet")  # type: ignore[arg-type]
    with pytest.raises(MemoryInputError, match="review_state"):
        mem.remember("u", "x", review_state="maybe")
    with pytest.raises(MemoryInputError, match="valid_from"):
        mem.remember("u", "x", valid_from="2024-01-01")  # type: ignore[arg-type]
    rec = mem.remember("u", "x")
    with pytest.raises(MemoryInputError, match="cannot update \\['subject'\\]"):
        mem.update(rec.memory_id, subject="other")
    with pytest.raises(MemoryInputError, match="not one of"):
        mem.flag(rec.memory_id, "wrong", "because")
    with pytest.raises(MemoryInputError, match="reason"):
        mem.flag(rec.memory_id, "stale", "")
    assert events(mem, rec.memory_id) == ["remember"]  # nothing half-applied


def test_vector_rules(mem: Memory) -> None:
    eid, dim = mem.embedder.embedder_id, mem.embedder.dim
    bad = np.ones(dim, dtype=np.float32)
    bad[3] = np.nan
    with pytest.raises(MemoryInputError, match="NaN"):
        mem.remember("u", "x", embedding=bad, embedder_id=eid)
    with pytest.raises(EmbedderMismatchError, match="dimension"):
        mem.remember("u", "x", embedding=np.ones(dim + 1), embedder_id=eid)
    with pytest.raises(EmbedderMismatchError, match="other-model"):
        mem.remember("u", "x", embedding=np.ones(dim), embedder_id="other-model")
    rec = mem.remember("u", "x given", embedding=np.arange(dim, dtype=np.float32), embedder_id=eid)
    vec = mem.embedding(rec.memory_id)
    assert vec is not None and abs(float(np.linalg.norm(vec)) - 1.0) < 1e-5  # normalized on the way in


class BadEmbedder:
    embedder_id = "bad"
    dim = 8

    def __init__(self, out: np.ndarray) -> None:
        self.out = out

    def embed(self, texts):  # noqa: ANN001
        return np.repeat(self.out[None, :], len(texts), axis=0)


def test_embedder_output_is_checked(con: duckdb.DuckDBPyConnection) -> None:
    with pytest.raises(MemoryInputError, match="NaN"):
        Memory(con, embedder=BadEmbedder(np.full(8, np.nan, np.float32))).remember("u", "x")
    with pytest.raises(EmbedderMismatchError, match="dimension"):
        Memory(con, embedder=BadEmbedder(np.ones(5, np.float32))).remember("u", "x")
    assert con.execute("SELECT count(*) FROM memories").fetchone() == (0,)


def test_embedder_id_or_dim_mismatch_with_the_store(con: duckdb.DuckDBPyConnection) -> None:
    Memory(con, embedder=HashingEmbedder()).remember("u", "stored with the hashing embedder")
    with pytest.raises(EmbedderMismatchError, match="not comparable"):
        Memory(con, embedder=HashingEmbedder(dim=128))
    with pytest.raises(EmbedderMismatchError, match="not comparable"):
        Memory(con, embedder=HashingEmbedder(char_ngrams=(2, 3)))
    Memory(con, embedder=HashingEmbedder())  # the same embedder opens fine
    Memory(con, embedder=None)  # no embedder: literal only, still fine


# -- changes -------------------------------------------------------------------------------
def test_update_logs_old_and_new_and_reembeds(mem: Memory) -> None:
    rec = mem.remember("u", "User lives in Berlin", confidence=70)
    new = mem.update(rec.memory_id, text="User lives in Lisbon", confidence=90, run_id="r2", reason="moved")
    assert (new.text, new.confidence) == ("User lives in Lisbon", 90) and new.updated_at > rec.updated_at
    ev = mem.history(rec.memory_id)[-1]
    assert (ev.event, ev.run_id, ev.reason) == ("update", "r2", "moved")
    assert ev.old == {"text": "User lives in Berlin", "confidence": 70.0}
    assert ev.new == {"text": "User lives in Lisbon", "confidence": 90.0}
    assert mem.search("u", "Lisbon").records[0].memory_id == rec.memory_id
    assert mem.search("u", "Berlin", semantic=False).no_match
    assert mem.update(rec.memory_id, confidence=90) == new  # no change, no event
    assert events(mem, rec.memory_id) == ["remember", "update"]


def test_flag_supersede_forget_purge(mem: Memory, con: duckdb.DuckDBPyConnection) -> None:
    a = mem.remember("u", "User is vegetarian", confidence=80)
    b = mem.remember("u", "User eats fish now", confidence=80)
    f = mem.flag(a.memory_id, "stale", "said so in turn 4", run_id="r3")
    assert f.review_state == "stale" and f.flagged
    old = mem.supersede(a.memory_id, b.memory_id, run_id="r4", reason="contradiction")
    assert old.review_state == "contradicted" and old.superseded_by == b.memory_id
    assert events(mem, a.memory_id) == ["remember", "flag", "supersede"]
    assert events(mem, b.memory_id) == ["remember", "supersedes"]
    assert mem.history(b.memory_id)[-1].new == {"supersedes": a.memory_id}

    gone = mem.forget(b.memory_id, run_id="r5", reason="user asked")
    assert gone.deleted_at is not None and mem.get(b.memory_id).forgotten
    assert mem.forget(b.memory_id) == gone  # idempotent, not logged twice
    assert events(mem, b.memory_id) == ["remember", "supersedes", "forget"]
    assert [r.memory_id for r in mem.list("u")] == [a.memory_id]
    assert len(mem.list("u", include_forgotten=True)) == 2
    assert mem.search("u", "fish").no_match
    with pytest.raises(MemoryInputError, match="forgotten"):
        mem.update(b.memory_id, confidence=10)

    mem.purge(a.memory_id, run_id="r6")
    with pytest.raises(MemoryNotFoundError):
        mem.get(a.memory_id)
    assert events(mem, a.memory_id) == ["remember", "flag", "supersede", "purge"]
    dump = json.dumps(con.execute("SELECT * FROM memory_events WHERE memory_id = ?", [a.memory_id]).fetchall(),
                      default=str)
    assert "vegetarian" not in dump  # a purge scrubs the text from the log too


def test_supersede_rules(mem: Memory) -> None:
    a = mem.remember("u", "fact a")
    other = mem.remember("v", "fact b")
    with pytest.raises(MemoryInputError, match="two subjects"):
        mem.supersede(a.memory_id, other.memory_id)
    with pytest.raises(MemoryInputError, match="itself"):
        mem.supersede(a.memory_id, a.memory_id)


def test_list_filters(mem: Memory) -> None:
    a = mem.remember("u", "one", tags=["x"])
    b = mem.remember("u", "two", tags=["y"])
    mem.remember("v", "three", tags=["x"])
    mem.flag(b.memory_id, "contradicted", "wrong")
    assert [r.text for r in mem.list("u")] == ["one", "two"]
    assert [r.text for r in mem.list("u", tag="x")] == ["one"]
    assert [r.text for r in mem.list("u", review_states=["contradicted"])] == ["two"]
    assert [r.text for r in mem.list("u", limit=1, offset=1)] == ["two"]
    assert mem.subjects() == ["u", "v"]
    assert a.memory_id in {r.memory_id for r in mem.list("u")}


# -- persistence and the index -------------------------------------------------------------
def test_index_survives_reopening_a_file(tmp_path: Path) -> None:
    path = str(tmp_path / "m.duckdb")
    c1 = duckdb.connect(path)
    m1 = Memory(c1)
    keep = m1.remember("u", "User plays the cello", confidence=90)
    drop = m1.remember("u", "User plays the cello badly")
    m1.forget(drop.memory_id)
    c1.close()
    m2 = Memory(duckdb.connect(path))
    res = m2.search("u", "cello", recall=True)
    assert [r.memory_id for r in res.records] == [keep.memory_id]


def test_records_without_vectors_are_embedded_when_an_embedder_arrives(con: duckdb.DuckDBPyConnection) -> None:
    plain = Memory(con, embedder=None)
    rec = plain.remember("u", "User likes jazz")
    assert plain.embedding(rec.memory_id) is None and rec.embedder_id is None
    assert plain.search("u", "jazz").index_unavailable_reason == "no embedder configured"
    smart = Memory(con)  # default hashing embedder
    res = smart.search("u", "jazz music")
    assert res.mode == "semantic" and res.records[0].memory_id == rec.memory_id
    assert smart.embedding(rec.memory_id) is not None
    assert smart.get(rec.memory_id).embedder_id == smart.embedder.embedder_id


def test_rebuild_index_matches_incremental(mem: Memory) -> None:
    for i in range(30):
        r = mem.remember("u", f"note {i} about topic {i % 4}", confidence=50 + i)
        if i % 5 == 0:
            mem.update(r.memory_id, text=f"revised note {i} about topic {i % 4}")
        if i % 7 == 0:
            mem.forget(r.memory_id)
    before = mem.search("u", "topic 2", limit=None, recall=True)
    mem.rebuild_index()
    after = mem.search("u", "topic 2", limit=None, recall=True)
    assert [r.memory_id for r in before.records] == [r.memory_id for r in after.records]
    assert before.total_before_filter == after.total_before_filter


def test_threads_share_one_connection(mem: Memory) -> None:
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for i in range(15):
                mem.remember(f"s{k}", f"thread {k} fact {i}", confidence=80)
                res = mem.search(f"s{k}", "fact", recall=True, limit=None)
                assert all(r.subject == f"s{k}" for r in res.records)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert [len(mem.list(f"s{k}")) for k in range(4)] == [15] * 4


def test_aware_datetimes_are_stored_as_utc(mem: Memory) -> None:
    tz = timezone(timedelta(hours=2))
    rec = mem.remember("u", "x", valid_from=datetime(2025, 1, 1, 14, 0, tzinfo=tz))
    assert rec.valid_from == datetime(2025, 1, 1, 12, 0)


def test_memory_package_stays_below_the_engine() -> None:
    src = Path(__file__).resolve().parents[1] / "tracemem" / "memory"
    for f in src.glob("*.py"):
        text = f.read_text()
        for banned in ("tracemem.runner", "tracemem.store", "tracemem.cli", "import stages", "from stages"):
            assert banned not in text, f"{f.name} imports {banned}"
        assert len(text.splitlines()) < 400, f"{f.name} is over 400 lines"


def test_reembed_switches_the_store_explicitly(mem: Memory, con: duckdb.DuckDBPyConnection) -> None:
    rec = mem.remember("u", "User collects stamps")
    gone = mem.remember("u", "User collects coins")
    mem.forget(gone.memory_id)
    small = HashingEmbedder(dim=64)
    with pytest.raises(EmbedderMismatchError):
        Memory(con, embedder=small)
    switcher = Memory(con, embedder=None)
    assert switcher.reembed(small) == 2
    reopened = Memory(con, embedder=small)  # now the store is bound to the new embedder
    assert reopened.embedding(rec.memory_id).shape == (64,)
    assert reopened.search("u", "stamps").records[0].memory_id == rec.memory_id
    with pytest.raises(EmbedderMismatchError):
        Memory(con, embedder=HashingEmbedder())
