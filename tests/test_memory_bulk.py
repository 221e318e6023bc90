"""Bulk remember: the fast paths write exactly what the one-at-a-time definitions give."""

from __future__ import annotations

import hashlib
import random
import re
import threading
from datetime import datetime, timedelta, timezone
from typing import Any

import duckdb
import numpy as np
import pytest

from tracemem.memory import HashingEmbedder, Memory, MemoryInputError, MemoryRecord, sql
from tracemem.memory.bulk import EventJSON, rows_of
from tracemem.memory.overlap import BLOCK, MIN_ROWS
from tracemem.memory.tables import MEMORY_COLUMNS
from tracemem.memory.text import normalize, words

T0 = datetime(2025, 1, 1, 12, 0, 0)


def corpus() -> list[str]:
    vocab = ["paint", "painting", "painted", "sunrise", "cello", "jazz", "Café’s", "don't", "rock'n'roll",
             "naïve", "x", "the", "a", "running", "stories", "42", "b2b", "PAINTINGS", "ünïcode", "😀", "tab\tsep",
             "dash-ed", "under_score"]
    out = [" ".join(vocab[(i * 31 + j * 17) % len(vocab)] for j in range(1 + (i * 7919) % 13)) for i in range(3000)]
    return out + ["", "   ", "the of a"]


def test_hashing_vectors_are_pinned_and_the_same_in_blocks() -> None:
    texts = corpus()
    # sha256 of the vectors as tracemem computed them before the bulk fast paths (main e237b45)
    pinned = {"hashing-v1:d384:c3-5:cw1:bw0": "c424603b2b1d2079d2bd56c0e636f2012df8929ac11920868f290ecc7eff3dc5",
              "hashing-v1:d64:c3-5:cw1:bw0.5": "e99d9eb8b5e3c6a04602c168470ecf1501dc55db4189fd8a5d12458544bdc796"}
    for emb in (HashingEmbedder(), HashingEmbedder(dim=64, bigram_weight=0.5)):
        h = hashlib.sha256()
        for s in range(0, len(texts), 700):
            h.update(emb.embed(texts[s:s + 700]).tobytes())
        assert h.hexdigest() == pinned[emb.embedder_id]
        whole = type(emb)(dim=emb.dim, bigram_weight=emb._bigram_weight).embed(texts)
        fresh = type(emb)(dim=emb.dim, bigram_weight=emb._bigram_weight)
        blocks = np.concatenate(list(fresh.embed_chunks(texts, 333)))
        assert whole.tobytes() == blocks.tobytes()


def test_hashing_vectors_match_the_reference_features() -> None:
    emb = HashingEmbedder()
    texts = corpus()[:300]
    got = emb.embed(texts)
    for text, row in zip(texts, got):
        ref = np.zeros(emb.dim)
        for feat, count in sorted(emb.features(text).items(), key=lambda kv: emb._feature_id(kv[0])):
            h = __import__("zlib").crc32(feat.encode("utf-8"))
            ref[h % emb.dim] += (1.0 if (h >> 31) & 1 else -1.0) * np.log1p(count)
        norm = np.linalg.norm(ref)
        assert np.allclose(row, ref / norm if norm else ref, atol=1e-6)


def test_ascii_words_split_like_the_regex() -> None:
    pattern = re.compile(r"[^\W_]+(?:'[^\W_]+)?")
    rng = random.Random(5)
    alphabet = [chr(c) for c in range(128)] + ["é", "’", "\u00a0", "２", "İ"]
    for i in range(20_000):
        text = "".join(rng.choice(alphabet if i % 3 == 0 else alphabet[:128]) for _ in range(rng.randint(0, 25)))
        assert words(text) == pattern.findall(normalize(text)), text


def record(**fields: Any) -> MemoryRecord:
    base: dict[str, Any] = dict(memory_id="m_0123456789abcdef", subject="u", text="hello", created_at=T0,
                                updated_at=T0, embedder_id="e")
    return MemoryRecord(**{**base, **fields})


def test_event_json_is_the_reference_text() -> None:
    sentinel = "\x00tracemem-bulk-text\x00"
    recs = [record(), record(text="Café’s \"quoted\" \\ \n 😀 \ud7ff"), record(confidence=-0.0),
            record(confidence=0.0),
            record(confidence=33.3, tags=("a", "b é"), review_state="stale"),
            record(valid_from=datetime(2024, 1, 1, 0, 0, 0, 1), valid_until=datetime(2030, 1, 1)),
            record(source_run_id="r", source_step=3, source_ref="ref \u2028"), record(text=sentinel),
            record(subject=sentinel), record(memory_id="m_" + "\x00tracemem-bulk-memory-id\x00"),
            record(embedder_id=None)]
    recs += [record(source_step=i, text=f"t{i}") for i in range(100)]  # past the template budget
    event = EventJSON(sql.event_json)
    for rec in recs + recs:
        assert event(rec) == sql.event_json(rec.audit_view())
    assert rows_of(recs) == [tuple(getattr(r, c) for c in MEMORY_COLUMNS) for r in recs]


@pytest.fixture
def con() -> duckdb.DuckDBPyConnection:
    c = duckdb.connect(":memory:")
    sql.ensure_tables(c)
    return c


class OneCallEmbedder:
    """The hashing embedder without `embed_chunks`: remember_many takes the one-statement path."""

    def __init__(self) -> None:
        self.inner = HashingEmbedder()
        self.embedder_id, self.dim = self.inner.embedder_id, self.inner.dim

    def embed(self, texts: list[str]) -> np.ndarray:
        return self.inner.embed(texts)


def items(n: int) -> list[dict[str, Any]]:
    texts = corpus()
    out: list[dict[str, Any]] = []
    for i in range(n):
        item: dict[str, Any] = {"subject": ["u", "v"][i % 2], "text": texts[i % len(texts)].strip() or f"fact {i}"}
        if i % 7 == 1:
            item.update(tags=["t", "é"], confidence=80, source_step=i)
        if i % 11 == 2:
            item["valid_from"] = datetime(2024, 5, 5, tzinfo=timezone(timedelta(hours=2)))
        out.append(item)
    return out


def stored(con: duckdb.DuckDBPyConnection) -> tuple[list[Any], list[Any]]:
    cols = [c for c in MEMORY_COLUMNS if c != "memory_id"]
    mems = con.execute(f"SELECT {', '.join(cols)}, embedding FROM memories ORDER BY created_at, text, subject, "
                       "source_step, memory_id").fetchall()
    evs = con.execute("SELECT new FROM memory_events ORDER BY event_id").fetchall()
    return sorted(map(repr, mems)), sorted(re.sub(r'"memory_id": "m_[0-9a-f]+"', "", e[0]) for e in evs)


def test_overlapped_remember_many_writes_what_one_statement_writes(con: duckdb.DuckDBPyConnection) -> None:
    n = MIN_ROWS + BLOCK // 2 + 7  # three blocks, the last one short
    fast = Memory(con, threading.RLock(), clock=lambda: T0, embedder=HashingEmbedder())
    recs = fast.remember_many(items(n), run_id="r1")
    other = duckdb.connect(":memory:")
    sql.ensure_tables(other)
    slow = Memory(other, threading.RLock(), clock=lambda: T0, embedder=OneCallEmbedder())  # type: ignore[arg-type]
    slow.remember_many(items(n), run_id="r1")
    assert stored(con) == stored(other)
    assert [r.text for r in recs] == [i["text"] for i in items(n)]
    events = con.execute("SELECT memory_id, new, run_id FROM memory_events ORDER BY event_id").fetchall()
    assert [(r.memory_id, sql.event_json(r.audit_view()), "r1") for r in recs] == events
    hit = fast.search("u", "painting sunrise", limit=5)
    assert hit.records and hit.mode == "semantic" and fast.index_is_current()


def test_overlapped_remember_many_is_all_or_nothing(con: duckdb.DuckDBPyConnection) -> None:
    mem = Memory(con, threading.RLock(), clock=lambda: T0, embedder=HashingEmbedder())
    mem.remember("u", "kept before")
    bad = items(MIN_ROWS + 10)
    bad[BLOCK + 3]["text"] = "lone surrogate \ud800 in the second block"
    with pytest.raises(MemoryInputError, match="lone surrogate"):  # (refused before the first block is written)
        mem.remember_many(bad)
    assert con.execute("SELECT count(*) FROM memories").fetchone() == (1,)
    assert con.execute("SELECT count(*) FROM memory_events").fetchone() == (1,)
    assert [r.text for r in mem.search("u", "kept").records] == ["kept before"] and mem.index_is_current()
    bad[BLOCK + 3] = {"subject": "u", "text": "x", "colour": "red"}
    with pytest.raises(MemoryInputError, match="unknown memory fields"):
        mem.remember_many(bad)
    assert con.execute("SELECT count(*) FROM memories").fetchone() == (1,)


def test_an_index_failure_during_the_commit_drops_the_index_not_the_rows(con: duckdb.DuckDBPyConnection,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from tracemem.memory.index import VectorIndex

    mem = Memory(con, threading.RLock(), clock=lambda: T0, embedder=HashingEmbedder())
    mem.remember("u", "kept before")
    real = VectorIndex.add_many

    def broken(self: VectorIndex, *args: Any) -> None:
        raise RuntimeError("index broke")

    monkeypatch.setattr(VectorIndex, "add_many", broken)
    with pytest.raises(RuntimeError, match="index broke"):
        mem.remember_many(items(MIN_ROWS))
    monkeypatch.setattr(VectorIndex, "add_many", real)
    assert con.execute("SELECT count(*) FROM memories").fetchone() == (MIN_ROWS + 1,)  # committed, as before
    assert mem.index_is_current() and mem.shard("u").live_count() == 1 + MIN_ROWS // 2


def test_tail_rows_grow_in_blocks_without_moving_rows() -> None:
    """vectors.TailRows: rows appended in any chunks read back exactly, block boundaries included, and the
    dot products are those of one matrix."""
    from tracemem.memory.vectors import BLOCK_ROWS, TailRows

    rng = np.random.default_rng(3)
    tail, parts = TailRows(8), []
    for size in (1, 15, 40, 1000, BLOCK_ROWS - 7, 3, BLOCK_ROWS + 5, 0, 2):
        block = rng.standard_normal((size, 8)).astype(np.float32)
        tail.append(block)
        parts.append(block)
    whole = np.concatenate(parts)
    assert tail.n == len(whole) and len(tail.blocks) > 3
    first = [b.ctypes.data for b in tail.blocks]
    tail.append(rng.standard_normal((5, 8)).astype(np.float32))
    assert [b.ctypes.data for b in tail.blocks[: len(first)]] == first  # nothing moved
    picks = rng.integers(0, len(whole), size=500)
    assert np.array_equal(tail.rows(picks), whole[picks])
    q = rng.standard_normal(8).astype(np.float32)
    got = tail.dot(q)[: len(whole)]
    assert np.allclose(got, whole @ q, rtol=1e-5, atol=1e-5)
    assert TailRows(8).dot(q).shape == (0,)
