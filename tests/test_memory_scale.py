"""Big memories: index files beside the DuckDB file, their staleness checks, the int8 scan, bulk inserts.

Timing is never asserted here (bench/memory_scale.py prints it); these tests pin the
answers: a reopened store answers like the process that wrote it, a stale or broken
file is rebuilt from DuckDB and never trusted, and the int8 scan returns what the
float32 scan returns.
"""

from __future__ import annotations

import zlib
from datetime import datetime
from pathlib import Path

import duckdb
import numpy as np
import pytest

from tracemem.errors import TracememError
from tracemem.memory import (EmbedderMismatchError, HashingEmbedder, Memory, MemoryInputError, MemoryNotFoundError,
                             MemoryStoreError)
from tracemem.memory import fingerprint
from tracemem.memory.index import Shard
from tracemem.memory.search import rank_shard
from tracemem.memory.vectors import int8_kernel, quantize

NOW = datetime(2025, 1, 1)


def open_memory(path: Path, **kw: object) -> Memory:
    kw.setdefault("embedder", HashingEmbedder())  # these tests are about the index files, not the embedder
    return Memory(duckdb.connect(str(path)), **kw)  # type: ignore[arg-type]


def fill(mem: Memory) -> dict[str, str]:
    ids = {}
    recs = mem.remember_many([{"subject": "u", "text": f"User note {i} about cello and jazz"} for i in range(40)])
    ids["first"] = recs[0].memory_id
    ids["cello"] = mem.remember("u", "User plays the cello every morning", confidence=90).memory_id
    ids["stale"] = mem.remember("u", "User plays the cello badly", confidence=90).memory_id
    mem.flag(ids["stale"], "stale", "no longer true")
    ids["other"] = mem.remember("v", "V plays the cello too", confidence=90).memory_id
    return ids


def answer(mem: Memory, subject: str = "u", query: str = "cello morning") -> tuple:
    res = mem.search(subject, query, recall=True, limit=5, now=NOW)
    return ([r.memory_id for r in res.records], [round(r.score, 9) for r in res.records], res.total_before_filter,
            res.excluded_flagged)


def test_errors_belong_to_the_one_tree() -> None:
    for cls in (MemoryStoreError, MemoryInputError, MemoryNotFoundError, EmbedderMismatchError):
        assert issubclass(cls, TracememError)
    assert issubclass(MemoryInputError, ValueError) and issubclass(MemoryNotFoundError, KeyError)


def test_close_writes_index_files_and_a_new_process_maps_them(tmp_path: Path) -> None:
    path = tmp_path / "m.duckdb"
    mem = open_memory(path)
    fill(mem)
    before = answer(mem)
    mem.close()
    mem.con.close()
    folder = tmp_path / "m.duckdb.memindex"
    assert (folder / "manifest.json").is_file() and len(list(folder.glob("*.shard"))) == 2
    again = open_memory(path)
    assert answer(again) == before
    assert again.rebuilt_subjects == []  # nothing re-read from the table
    base = again.shard("u").vecs.base
    assert base is not None and not base.flags.owndata and not base.flags.writeable  # mapped from the file


def test_a_change_made_with_plain_sql_makes_the_file_stale(tmp_path: Path) -> None:
    path = tmp_path / "m.duckdb"
    mem = open_memory(path)
    ids = fill(mem)
    mem.close()
    mem.con.execute("UPDATE memories SET review_state = 'contradicted' WHERE memory_id = ?", [ids["cello"]])
    mem.con.close()
    again = open_memory(path)
    res = again.search("u", "cello morning", recall=True, now=NOW)
    assert ids["cello"] not in [r.memory_id for r in res.records]  # flagged by SQL: never injected
    assert again.rebuilt_subjects == ["u"]  # only the changed subject is rebuilt


def test_same_process_sql_change_is_caught_before_a_record_is_returned(tmp_path: Path) -> None:
    mem = open_memory(tmp_path / "m.duckdb")
    ids = fill(mem)
    mem.search("u", "cello", now=NOW)  # the index is loaded
    mem.con.execute("UPDATE memories SET review_state = 'stale' WHERE memory_id = ?", [ids["cello"]])
    res = mem.search("u", "cello morning", recall=True, now=NOW)
    assert ids["cello"] not in [r.memory_id for r in res.records]
    assert all(not r.flagged for r in res.records)


def test_a_torn_or_missing_file_is_rebuilt(tmp_path: Path) -> None:
    path = tmp_path / "m.duckdb"
    mem = open_memory(path)
    fill(mem)
    before = answer(mem)
    mem.close()
    mem.con.close()
    shards = sorted((tmp_path / "m.duckdb.memindex").glob("*.shard"))
    for shard in shards:
        with open(shard, "r+b") as fh:
            fh.truncate(200)
    again = open_memory(path)
    assert answer(again) == before and answer(again, "v", "cello") [0]
    assert sorted(again.rebuilt_subjects) == ["u", "v"]
    again.close()  # writes good files again
    for shard in shards:
        shard.unlink(missing_ok=True)
    assert answer(open_memory(path)) == before


def test_files_of_another_embedder_are_not_used(tmp_path: Path) -> None:
    path = tmp_path / "m.duckdb"
    mem = open_memory(path)
    fill(mem)
    mem.close()
    mem.con.close()
    other = Memory(duckdb.connect(str(path)), embedder=None)
    assert other.search("u", "cello").mode == "literal"
    assert sorted(other.rebuilt_subjects) == ["u", "v"]


def test_the_kept_fingerprint_equals_the_table_after_every_kind_of_change(tmp_path: Path) -> None:
    mem = open_memory(tmp_path / "m.duckdb")
    ids = fill(mem)
    mem.update(ids["first"], text="User switched from cello to viola")
    mem.update(ids["cello"], confidence=95, valid_until=datetime(2030, 1, 1))
    new = mem.remember("u", "User plays the viola", confidence=90)
    mem.supersede(ids["cello"], new.memory_id)
    mem.forget(ids["stale"])
    mem.purge(ids["other"])  # subject v has no row left
    assert mem.index_is_current()
    assert "v" not in fingerprint.by_subject(mem.con)
    assert mem.save_index() and mem.save_index() == []  # saved once, then nothing is dirty


def test_hashing_embedder_bulk_path_matches_its_feature_definition() -> None:
    emb = HashingEmbedder(bigram_weight=0.5)
    texts = ["The Café’s PAINTINGS were painted", "", "the of and", "aaaa aaaa bbbb", "Caroline: I went paddling"]
    ref = np.zeros((len(texts), emb.dim), dtype=np.float64)
    for row, text in enumerate(texts):  # the definition: one log-damped count per feature, hashed with CRC32
        for feat, count in emb.features(text).items():
            h = zlib.crc32(feat.encode("utf-8"))
            ref[row, h % emb.dim] += (1.0 if (h >> 31) & 1 else -1.0) * np.log1p(count)
    norms = np.linalg.norm(ref, axis=1, keepdims=True)
    ref = np.divide(ref, norms, out=np.zeros_like(ref), where=norms > 0)
    got = emb.embed(texts)
    assert np.abs(got - ref).max() < 1e-6
    assert np.array_equal(got, emb.embed(list(reversed(texts)))[::-1])  # no dependence on the batch


def random_shard(n: int, dim: int = 64, seed: int = 3) -> tuple[Shard, np.ndarray]:
    rng = np.random.default_rng(seed)
    vecs = rng.standard_normal((n, dim)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    words = [f"w{i}" for i in range(50)]
    recs = [(f"m_{i:06d}", "s", " ".join(rng.choice(words, size=5)), (), float(rng.integers(40, 100)),
             "stale" if i % 17 == 0 else "fresh", None, None, None, None, None, "e", NOW, NOW, None, None)
            for i in range(n)]
    shard = Shard(dim)
    shard.append_many(recs, vecs)
    arrays, vocab = shard.arrays()
    return Shard(dim, {**arrays, **quantize(arrays["vec_f32"])}, vocab), rng.standard_normal(dim).astype(np.float32)


@pytest.mark.skipif(int8_kernel() is None, reason="numkong (the 'scale' extra) is not installed")
def test_int8_scan_is_reranked_in_float32_and_says_how_good_it_is() -> None:
    shard, q = random_shard(3000)
    q /= np.linalg.norm(q)
    shard.vecs.int8_min_rows = 0
    recall = shard.vecs.measure_recall()
    assert recall is not None and 0.9 <= recall <= 1.0
    same = 0
    for limit, recall_mode, query in [(10, False, "w1 w2"), (5, True, "w3"), (10, True, "w4 w5 w6"), (10, True, "zz")]:
        args = dict(query_vec=q, lexical_weight=0.5, min_similarity=0.05, recall=recall_mode, floor=60, now=NOW,
                    limit=limit)
        shard.vecs.int8_min_rows = 0
        fast = rank_shard(shard, query, **args)  # type: ignore[arg-type]
        assert shard.vecs.mode() == "int8"
        shard.vecs.int8_min_rows = 10**9
        exact = rank_shard(shard, query, **args)  # type: ignore[arg-type]
        # every score reported is a float32 score, whatever the scan
        common = np.intersect1d(fast.rows, exact.rows)
        assert np.allclose(fast.similarity[common], exact.similarity[common], atol=1e-6)
        same += fast.rows.tolist() == exact.rows.tolist()
        assert abs(fast.total - exact.total) <= 0.05 * exact.total + 1
    assert same >= 3


@pytest.mark.skipif(int8_kernel() is None, reason="numkong (the 'scale' extra) is not installed")
def test_a_subject_scanned_in_int8_below_the_pruned_size_keeps_its_context_lift() -> None:
    shard, q = random_shard(3000)
    q /= np.linalg.norm(q)
    shard.vecs.int8_min_rows = 0  # scanned through its int8 codes; pruned_min_rows stays at its default
    same = 0
    for query in ("w1 w2", "w3", "w4 w5 w6"):
        args = dict(query_vec=q, lexical_weight=0.5, min_similarity=0.05, recall=False, floor=60, now=NOW, limit=10)
        plain = rank_shard(shard, query, **args)  # type: ignore[arg-type]
        lifted = rank_shard(shard, query, **args, context_weight=0.5, context_window=5)  # type: ignore[arg-type]
        assert shard.vecs.mode() == "int8" and plain.scan is None and lifted.scan is None  # (not through bounds)
        top = lifted.rows
        assert (lifted.score[top] >= plain.score[top] - 1e-9).all() and (lifted.score[top] > plain.score[top]).any()
        shard.vecs.int8_min_rows = 10**9
        exact = rank_shard(shard, query, **args, context_weight=0.5, context_window=5)  # type: ignore[arg-type]
        shard.vecs.int8_min_rows = 0
        same += top.tolist() == exact.rows.tolist()
    assert same >= 2


def test_an_int8_search_names_its_mode_in_the_receipt() -> None:
    from tracemem.memory.search import SearchResult

    res = SearchResult(subject="u", query="q", records=[], mode="semantic", requested_semantic=True, now=NOW,
                       scan="int8", scan_recall=0.987)
    assert "approximate vector scan (int8" in res.receipt() and "0.987" in res.receipt()


def test_row_reader_reads_the_rows_a_mapping_would(tmp_path: Path) -> None:
    from tracemem.memory.persist import RowReader, load_shard, save_shard

    shard, _ = random_shard(500)
    arrays, vocab = shard.arrays()
    name = save_shard(tmp_path, "s", (500, 7), arrays, vocab)
    mapped, _ = load_shard(tmp_path / name, "s", (500, 7))
    read, _ = load_shard(tmp_path / name, "s", (500, 7), random_access=("vec_f32",))
    assert isinstance(read["vec_f32"], RowReader)
    rows = np.array([499, 0, 17, 17, 250])
    assert np.array_equal(read["vec_f32"].rows(rows), mapped["vec_f32"][rows])
    assert np.array_equal(read["vec_f32"].array(), mapped["vec_f32"])
    again = Shard(64, read, vocab)
    q = np.asarray(mapped["vec_f32"][3])
    assert np.allclose(again.vecs.exact(rows, q), mapped["vec_f32"][rows] @ q)
