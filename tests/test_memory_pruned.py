"""Big shards ranked through bounds (memory/pruned.py, bounded.py, maxscore.py).

These pin the answers, never the speed: the pruned path returns the rows, scores and
exclusions a float32 scan of every row returns; only the count of vector-only
matches is an estimate, and the result and its receipt say so.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
import pytest

from tracemem.memory import bounded, maxscore, pruned
from tracemem.memory.bounded import QueryScores
from tracemem.memory.index import Shard
from tracemem.memory.search import SearchResult, rank_shard
from tracemem.memory.vectors import int8_kernel, quantize

NOW = datetime(2025, 1, 1)
DIM = 32
needs_kernel = pytest.mark.skipif(int8_kernel() is None, reason="numkong (the 'scale' extra) is not installed")


def record(i: int, text: str, review: str = "fresh", conf: float = 80.0,
           until: datetime | None = None) -> tuple:
    return (f"m_{i:06d}", "s", text, (), conf, review, None, until, None, None, None, "e", NOW, NOW, None, None)


def zipf_texts(n: int, rng: np.random.Generator, words: int = 300) -> list[str]:
    """Texts whose words follow a Zipf law: a few words in most texts, most words in a few."""
    p = 1 / np.arange(1, words + 1) ** 1.1
    picks = rng.choice(words, size=(n, 6), p=p / p.sum())
    return [" ".join(f"w{j}" for j in row) for row in picks]


def vectors(texts: list[str], rng: np.random.Generator) -> np.ndarray:
    """Vectors that share a direction per word (so cosine follows the words), plus noise."""
    base = rng.standard_normal((300, DIM)).astype(np.float32)
    out = np.stack([base[[int(w[1:]) for w in t.split()]].sum(axis=0) for t in texts])
    out += rng.standard_normal(out.shape).astype(np.float32) * 2
    return out / np.linalg.norm(out, axis=1, keepdims=True)


def big_shard(n: int = 4000, seed: int = 5, flagged_every: int = 0) -> tuple[Shard, np.ndarray, list[str]]:
    """A shard loaded from arrays (a base with int8 codes), as a shard file gives it."""
    rng = np.random.default_rng(seed)
    texts = zipf_texts(n, rng)
    vecs = vectors(texts, rng)
    recs = []
    for i, t in enumerate(texts):
        review = "stale" if flagged_every and i % flagged_every == 0 else "fresh"
        conf = 30.0 if flagged_every and i % (flagged_every + 1) == 0 else 80.0
        until = NOW - timedelta(days=1) if flagged_every and i % (flagged_every + 2) == 0 else None
        recs.append(record(i, t, review, conf, until))
    shard = Shard(DIM)
    shard.append_many(recs, vecs)
    arrays, vocab = shard.arrays()
    loaded = Shard(DIM, {**arrays, **quantize(arrays["vec_f32"])}, vocab)
    return loaded, vecs, texts


def query_vec(vecs: np.ndarray, rows: list[int]) -> np.ndarray:
    q = vecs[rows].sum(axis=0)
    return q / np.linalg.norm(q)


def both(shard: Shard, query: str, qv: np.ndarray, **kw: object) -> tuple:
    args = dict(query_vec=qv, lexical_weight=0.9, min_similarity=0.1, recall=False, floor=60.0, now=NOW, limit=10)
    args.update(kw)
    assert shard.vecs is not None
    shard.vecs.int8_min_rows = shard.vecs.pruned_min_rows = 0
    fast = rank_shard(shard, query, **args)  # type: ignore[arg-type]
    shard.vecs.int8_min_rows = 10**12
    exact = rank_shard(shard, query, **args)  # type: ignore[arg-type]
    return fast, exact


def same_answer(fast, exact) -> None:  # noqa: ANN001
    assert fast.scan == "pruned"
    assert fast.rows.tolist() == exact.rows.tolist()
    for r in fast.rows.tolist():
        assert fast.score[r] == pytest.approx(exact.score[r], abs=1e-6)
        assert fast.lexical[r] == exact.lexical[r]  # BM25 parts: the same float64
        assert fast.similarity[r] == pytest.approx(exact.similarity[r], abs=1e-6)


QUERIES = ["w0 w7 w150", "w3 w250", "w0 w1", "w0", "w2 w5 w9 w40", "w120 w0 w0 w4", "w299 w298 w1"]


@needs_kernel
@pytest.mark.parametrize("common_df", [1, 10**9])  # every frequent term bounded, or none
@pytest.mark.parametrize("dense_rows", [20_000, 5])  # the bounds kept, or given up for dense arrays
def test_pruned_ranking_equals_a_float32_scan(monkeypatch: pytest.MonkeyPatch, common_df: int, dense_rows: int) -> None:
    monkeypatch.setattr(maxscore, "COMMON_DF", common_df)
    monkeypatch.setattr(bounded, "DENSE_ROWS", dense_rows)
    shard, vecs, texts = big_shard()
    ran = 0
    for i, query in enumerate(QUERIES):
        qv = query_vec(vecs, [i, i + 7])
        fast, exact = both(shard, query, qv)
        if fast.scan != "pruned":  # the bounds did not close: it scanned every vector (int8), as before
            continue
        ran += 1
        same_answer(fast, exact)
        assert fast.total_lexical == int(np.count_nonzero(shard.lex.score(shard.lex.lookup(query.split()), shard.n)))
        assert abs(fast.total - exact.total) <= 0.15 * exact.total + 30  # vector-only matches: estimated
    assert ran >= 5


@needs_kernel
def test_lexical_matches_are_counted_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(maxscore, "COMMON_DF", 1)
    shard, _, _ = big_shard()
    for query in QUERIES:
        qtids = shard.lex.lookup(query.split())
        scores = QueryScores(shard.lex, shard.n, qtids, shard.alive, shard.n_dead, shard.memo)
        dense = shard.lex.score(qtids, shard.n)
        assert scores.matched == int(np.count_nonzero(dense))
        rows = np.arange(shard.n)
        assert np.array_equal(scores.is_lexical(rows), dense > 0)
        top, values = scores.highest(25)
        assert np.array_equal(values, np.sort(dense)[::-1][:25])  # exact float64, best first
        x = float(np.sort(dense)[-40])
        got, got_values = scores.at_least(x)
        assert np.array_equal(got, np.flatnonzero(dense >= x)) and np.array_equal(got_values, dense[got])


@needs_kernel
def test_recall_filter_is_exact_on_the_pruned_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(maxscore, "COMMON_DF", 1)
    shard, vecs, _ = big_shard(flagged_every=5)
    for i, query in enumerate(QUERIES[:4]):
        fast, exact = both(shard, query, query_vec(vecs, [i]), recall=True)
        assert fast.scan == "pruned"
        same_answer(fast, exact)
        assert fast.counts == exact.counts and sum(fast.counts.values()) > 0
        assert sorted(fast.exclusions) == sorted(exact.exclusions)


@needs_kernel
def test_dead_and_added_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(maxscore, "COMMON_DF", 1)
    shard, vecs, texts = big_shard()
    for i in range(0, 4000, 3):
        shard.retire(f"m_{i:06d}")
    rng = np.random.default_rng(9)
    more = zipf_texts(300, rng)
    shard.append_many([record(5000 + i, t) for i, t in enumerate(more)], vectors(more, rng))
    assert not shard.needs_compaction()
    for i, query in enumerate(QUERIES):
        fast, exact = both(shard, query, query_vec(vecs, [i + 1]))
        if fast.scan == "pruned":
            same_answer(fast, exact)
            assert all(shard.alive[r] for r in fast.rows.tolist())


@needs_kernel
def test_no_lexical_match_or_a_strong_cosine_weight_scans_every_vector() -> None:
    shard, vecs, _ = big_shard()
    fast, _ = both(shard, "nothing matches", query_vec(vecs, [1]))
    assert fast.scan is None  # the int8 scan ran (its receipt is the int8 one)
    fast, _ = both(shard, "w0 w1", query_vec(vecs, [1]), lexical_weight=0.3)  # cosine could outrank BM25
    assert fast.scan is None


def test_the_receipt_says_the_count_is_estimated() -> None:
    res = SearchResult(subject="u", query="q", records=[], mode="semantic", requested_semantic=True, now=NOW,
                       scan="pruned", count_estimated=True, total_before_filter=1200, total_lexical=1000,
                       count_sample=32768)
    text = res.receipt()
    assert "about 1200 matching" in text and "1000 share a query term (counted exactly)" in text
    assert "about 200 more by vector similarity alone" in text and "32768 sampled" in text
    assert "same ranking and filters as a float32 scan" in text


def test_sample_is_evenly_spread_over_the_file_rows() -> None:
    shard, _, _ = big_shard(n=1000)
    rows, codes, scales = pruned._sample(shard)
    assert len(rows) == 1000 and codes.shape == (1000, DIM) and scales.shape == (1000,)


@pytest.mark.parametrize("common_df", [1, 10**9])
@pytest.mark.parametrize("dense_rows", [20_000, 5])
def test_literal_search_of_a_big_shard_is_exact(monkeypatch: pytest.MonkeyPatch, common_df: int, dense_rows: int) -> None:
    monkeypatch.setattr(maxscore, "COMMON_DF", common_df)
    monkeypatch.setattr(bounded, "DENSE_ROWS", dense_rows)
    shard, _, _ = big_shard(flagged_every=5)
    for query in QUERIES:
        for recall, limit in ((False, 10), (True, 3), (True, 25)):
            args = dict(query_vec=None, lexical_weight=0.9, min_similarity=0.1, recall=recall, floor=60.0, now=NOW,
                        limit=limit)
            monkeypatch.setattr(pruned, "LITERAL_MIN_ROWS", 0)
            fast = rank_shard(shard, query, **args)  # type: ignore[arg-type]
            monkeypatch.setattr(pruned, "LITERAL_MIN_ROWS", 10**12)
            exact = rank_shard(shard, query, **args)  # type: ignore[arg-type]
            assert fast.rows.tolist() == exact.rows.tolist()
            assert [fast.score[r] for r in fast.rows.tolist()] == [exact.score[r] for r in exact.rows.tolist()]
            assert (fast.total, fast.cut, fast.counts) == (exact.total, exact.cut, exact.counts)
            assert sorted(fast.exclusions) == sorted(exact.exclusions)
            assert fast.sample is None and fast.scan is None  # nothing estimated
