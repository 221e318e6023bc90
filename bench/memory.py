"""Memory benchmarks: search latency, insert throughput, LoCoMo evidence recall.

Prints figures; asserts nothing. Usage:

    python bench/memory.py            # full: 10k/100k latency, all 10 LoCoMo conversations
    python bench/memory.py --quick    # small: 2k/10k latency, 2 conversations, no MiniLM
    python bench/memory.py --no-minilm --data PATH/locomo10.json
    python bench/memory.py --no-scale # LoCoMo only
    python bench/memory.py --no-scale --only "default before,new default"   # some of the methods

LoCoMo (not shipped; see ../shared/data/README.md): every turn is stored as a
memory `speaker: text` (subject = conversation id, source_ref = turn id), in
the order of the conversation; each question of categories 1-4 is a query;
evidence recall@k is the share of the question's evidence turns found in the
top k, averaged per category. Settings are chosen on conversations 0-4 and
reported on 5-9 separately (and on all ten). The time per query includes
embedding the query (most of MiniLM's share); it is printed as wall-clock
time and as the searching thread's CPU time, which other processes' load
stretches much less (ONNX Runtime runs on the calling thread with one thread;
numpy's BLAS may use threads of its own, which this does not count). The candidates side by side:
the default before and MiniLM before (numpy forward pass), MiniLM on ONNX
Runtime with one thread, conversation context at three weights, and the new
default; MiniLM's two runtimes give the same vectors, so the records are
embedded once for both and only the queries' embedding differs.

Inserts go into a DuckDB file (what users have), not an in-memory database;
"open + first search" reopens that file and searches once.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Callable, Sequence

import duckdb
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tracemem.memory import HashingEmbedder, Memory, MiniLMEmbedder  # noqa: E402
from tracemem.memory.context import CONTEXT_WEIGHT, CONTEXT_WINDOW  # noqa: E402
from tracemem.memory.errors import EmbedderUnavailableError  # noqa: E402

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo10.json"
CATS = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}


class RandomEmbedder:
    """Latency-only stand-in: random unit vectors of dim 384 (quality is not measured with it)."""

    embedder_id = "bench-random:384"
    dim = 384
    caveat = None

    def __init__(self, seed: int = 0) -> None:
        self._rng = np.random.default_rng(seed)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        v = self._rng.standard_normal((len(texts), self.dim), dtype=np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)


class Cached:
    """Wraps an expensive embedder so two methods on the same records embed them once.

    A call with one text is a query: it is always embedded, so the time per query
    includes the query embedding (MiniLM's ~5-10 ms is most of its cost).
    """

    def __init__(self, inner) -> None:
        self.inner, self._memo = inner, {}
        self.records_from: Cached | None = None
        for attr in ("embedder_id", "dim", "caveat", "lexical_weight", "min_similarity"):
            if hasattr(inner, attr):
                setattr(self, attr, getattr(inner, attr))

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if len(texts) == 1:
            return self.inner.embed(texts)
        if self.records_from is not None:
            return self.records_from.embed(texts)
        todo = [t for t in dict.fromkeys(texts) if t not in self._memo]
        if todo:
            self._memo.update(zip(todo, self.inner.embed(todo)))
        return np.stack([self._memo[t] for t in texts]) if texts else np.zeros((0, self.dim), np.float32)

    def share(self, other: "Cached") -> None:
        """Take records' vectors from `other` (two runtimes of one model: the same vectors, embedded once, by the
        faster one), whichever method asks first; queries are still embedded by this one."""
        self.records_from = other


def fresh(embedder, path: str | None = None) -> Memory:
    """A memory on a new DuckDB database: in memory, or in a file when `path` is given."""
    return Memory(duckdb.connect(path or ":memory:"), threading.RLock(), embedder=embedder)


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


# -- latency and throughput ------------------------------------------------------------
def bench_scale(n: int, queries: int = 200) -> dict[str, float]:
    rng = np.random.default_rng(n)
    vocab = [f"w{i}" for i in range(5000)]
    texts = [" ".join(rng.choice(vocab, size=rng.integers(6, 16))) for _ in range(n)]
    folder = tempfile.mkdtemp(prefix="tracemem-bench-memory-")
    mem = fresh(RandomEmbedder(), os.path.join(folder, "bulk.duckdb"))  # a store file, as users have
    t0 = time.perf_counter()
    for start in range(0, n, 5000):
        mem.remember_many({"subject": "s", "text": t} for t in texts[start:start + 5000])
    bulk = n / (time.perf_counter() - t0)
    mem.close()  # writes the index files
    mem.con.close()
    t0 = time.perf_counter()
    mem = fresh(RandomEmbedder(), os.path.join(folder, "bulk.duckdb"))
    mem.search("s", "w1 w2", limit=10)  # the first search after opening the file
    load_s = time.perf_counter() - t0
    shard = mem.shard("s")
    assert shard is not None and shard.vecs is not None
    qs = rng.standard_normal((queries, 384)).astype(np.float32)
    qs /= np.linalg.norm(qs, axis=1, keepdims=True)
    for q in qs[:20]:  # warm-up (BLAS threads, caches)
        shard.vecs.scan(q)
        mem.search("s", "w1 w2", limit=10)
    vec_ms = []
    for q in qs:
        t = time.perf_counter()
        sims = shard.vecs.scan(q)[0]
        top = np.argpartition(-sims, 10)[:10]
        top[np.argsort(-sims[top])]
        vec_ms.append(1000 * (time.perf_counter() - t))
    full_ms, rec_ms = [], []
    for i in range(queries):
        q = " ".join(rng.choice(vocab, size=5))
        t = time.perf_counter()
        mem.search("s", q, limit=10)
        full_ms.append(1000 * (time.perf_counter() - t))
        t = time.perf_counter()
        mem.search("s", q, limit=10, recall=True)
        rec_ms.append(1000 * (time.perf_counter() - t))
    single = fresh(RandomEmbedder(), os.path.join(folder, "single.duckdb"))
    m = min(n, 1000)
    t0 = time.perf_counter()
    for t in texts[:m]:
        single.remember("s", t)
    one = m / (time.perf_counter() - t0)
    mem.con.close()
    single.con.close()
    shutil.rmtree(folder, ignore_errors=True)
    return {"n": n, "vec_p50": pct(vec_ms, 50), "vec_p95": pct(vec_ms, 95), "search_p50": pct(full_ms, 50),
            "search_p95": pct(full_ms, 95), "recall_p50": pct(rec_ms, 50), "recall_p95": pct(rec_ms, 95),
            "bulk_per_s": bulk, "single_per_s": one, "load_s": load_s}


# -- LoCoMo -----------------------------------------------------------------------------
def load_locomo(path: Path, limit: int | None) -> list[tuple[str, list[tuple[str, str]], list[tuple[str, set[str], int]]]]:
    data = json.loads(path.read_text())
    out = []
    for conv in data[:limit]:
        c = conv["conversation"]
        turns, i = [], 1
        while f"session_{i}" in c:
            turns += [(t["dia_id"], f"{t['speaker']}: {t['text']}") for t in c[f"session_{i}"]]
            i += 1
        qs = []
        for q in conv["qa"]:
            ev = {p for e in q.get("evidence", []) for p in re.split(r"[;,\s]+", e) if p}
            if q["category"] in CATS and ev:
                qs.append((q["question"], ev, q["category"]))
        out.append((conv["sample_id"], turns, qs))
    return out


def plain_bm25(texts: list[str]) -> Callable[[str, int], list[int]]:
    """The classic baseline: lower-case word tokens, English stopwords, k1=1.2, b=0.75, no stemming."""
    from tracemem.memory.text import STOPWORDS

    tok = lambda s: [w for w in re.findall(r"[a-z0-9]+", s.lower()) if w not in STOPWORDS]  # noqa: E731
    docs = [Counter(tok(t)) for t in texts]
    n, lens = len(docs), np.array([sum(d.values()) for d in docs], float)
    avg, df = lens.mean(), Counter(w for d in docs for w in d)

    def rank(q: str, k: int) -> list[int]:
        s = np.zeros(n)
        for w in set(tok(q)):
            idf = math.log(1 + (n - df[w] + 0.5) / (df[w] + 0.5))
            for i, d in enumerate(docs):
                if w in d:
                    s[i] += idf * d[w] * 2.2 / (d[w] + 1.2 * (0.25 + 0.75 * lens[i] / avg))
        return list(np.argsort(-s, kind="stable")[:k])
    return rank


def vector_only(embedder, texts: list[str]) -> Callable[[str, int], list[int]]:
    mat = embedder.embed(texts)
    return lambda q, k: list(np.argsort(-(mat @ embedder.embed([q])[0]), kind="stable")[:k])


def memory_ranker(embedder, texts: list[str], ids: list[str], *, semantic: bool,
                  context_weight: float = 0.0, context_window: int = 0) -> Callable[[str, int], list[int]]:
    """Ranks through a real `Memory` (remember_many, then search): what a user of the store gets."""
    mem = Memory(duckdb.connect(":memory:"), threading.RLock(), embedder=embedder, context_weight=context_weight,
                 context_window=context_window)
    recs = mem.remember_many({"subject": "conv", "text": t, "source_ref": i} for t, i in zip(texts, ids))
    pos = {r.memory_id: j for j, r in enumerate(recs)}
    return lambda q, k: [pos[r.memory_id] for r in mem.search("conv", q, semantic=semantic, limit=k).records]


PARTS = (("conversations 0-4", range(0, 5)), ("conversations 5-9", range(5, 10)), ("all", range(0, 10)))


def eval_locomo(convs, methods: dict[str, Callable]) -> dict[str, dict]:
    """Per method: recall@5/@10 by (part, category) and ms per query (mean, p50), the query's embedding included."""
    results = {}
    for name, make in methods.items():
        hits: dict[tuple, list[float]] = defaultdict(list)
        times, cpu = [], []  # wall-clock, and this thread's CPU time (less stretched by other processes' load)
        for ci, (_, turns, qs) in enumerate(convs):
            ids, texts = [i for i, _ in turns], [t for _, t in turns]
            rank = make(texts, ids)
            parts = [p for p, convs_in in PARTS if ci in convs_in]
            for q, ev, cat in qs:
                t0, c0 = time.perf_counter(), time.thread_time()
                top = [ids[j] for j in rank(q, 10)]
                times.append(1000 * (time.perf_counter() - t0))
                cpu.append(1000 * (time.thread_time() - c0))
                for k in (5, 10):
                    r = len(ev & set(top[:k])) / len(ev)
                    for part in parts:
                        hits[(part, cat, k)].append(r)
                        hits[(part, "all", k)].append(r)
        row = {key: sum(v) / len(v) for key, v in hits.items()} | {
            "ms": statistics.mean(times), "p50": statistics.median(times), "cpu_p50": statistics.median(cpu)}
        results[name] = row
        print(f"  {name:<44} @5 {row[('all', 'all', 5)]:.3f}  @10 {row[('all', 'all', 10)]:.3f}  {row['ms']:.2f} ms/query "
              f"(p50 {row['p50']:.2f}, CPU p50 {row['cpu_p50']:.2f}) | 0-4 @10 {row.get(('conversations 0-4', 'all', 10), float('nan')):.3f}, "
              f"5-9 @10 {row.get(('conversations 5-9', 'all', 10), float('nan')):.3f}", flush=True)
    return results


def locomo_methods(quick: bool, no_minilm: bool) -> dict[str, Callable]:
    """The candidates, side by side: today's two searches, the new default, and the parts they are made of."""
    hashing = HashingEmbedder()
    methods: dict[str, Callable] = {
        "BM25 baseline (plain tokens)": lambda texts, ids: plain_bm25(texts),
        "literal search (ours: BM25+PRF)": lambda texts, ids: memory_ranker(hashing, texts, ids, semantic=False),
        "hashing embedder, vector only": lambda texts, ids: vector_only(hashing, texts),
        OLD_DEFAULT: lambda texts, ids: memory_ranker(hashing, texts, ids, semantic=True),
        FALLBACK: lambda texts, ids: memory_ranker(hashing, texts, ids, semantic=True, context_weight=CONTEXT_WEIGHT,
                                                   context_window=CONTEXT_WINDOW),
    }
    if quick or no_minilm:
        return methods
    try:
        onnx = Cached(MiniLMEmbedder(runtime="onnx"))
        numpy_pass = Cached(MiniLMEmbedder(runtime="numpy"))
    except EmbedderUnavailableError as exc:
        print(f"  (MiniLM skipped: {exc})")
        return methods
    numpy_pass.share(onnx)  # the two runtimes give the same vectors: the records are embedded once
    methods["MiniLM, vector only"] = lambda texts, ids: vector_only(onnx, texts)
    methods[OLD_MINILM] = lambda texts, ids: memory_ranker(numpy_pass, texts, ids, semantic=True)
    methods["BM25 ⊕ MiniLM (ONNX Runtime, 1 thread)"] = lambda texts, ids: memory_ranker(onnx, texts, ids, semantic=True)
    for w in (0.25, 0.75):
        methods[f"BM25 ⊕ MiniLM + context {w}"] = (
            lambda texts, ids, w=w: memory_ranker(onnx, texts, ids, semantic=True, context_weight=w))
    methods[NO_WINDOW] = lambda texts, ids: memory_ranker(onnx, texts, ids, semantic=True, context_weight=CONTEXT_WEIGHT)
    methods[NEW_DEFAULT] = lambda texts, ids: memory_ranker(onnx, texts, ids, semantic=True, context_weight=CONTEXT_WEIGHT,
                                                            context_window=CONTEXT_WINDOW)
    return methods


OLD_DEFAULT = "default before (BM25 ⊕ hashing)"
FALLBACK = f"fallback (BM25 ⊕ hashing + context {CONTEXT_WEIGHT}, window {CONTEXT_WINDOW})"
OLD_MINILM = "MiniLM before (BM25 ⊕ MiniLM, numpy)"
NO_WINDOW = f"BM25 ⊕ MiniLM ONNX + context {CONTEXT_WEIGHT}, no window"
NEW_DEFAULT = f"new default (BM25 ⊕ MiniLM ONNX + context {CONTEXT_WEIGHT}, window {CONTEXT_WINDOW})"


def print_locomo(locomo: dict[str, dict]) -> None:
    head = " | ".join(f"c{c} {CATS[c]} @5 / @10" for c in CATS)
    for part, _ in PARTS:
        print(f"\n{part}\n")
        print(f"| method | all @5 | all @10 | {head} | ms/query mean / p50 / CPU p50 |")
        print("|---|---:|---:|" + "---:|" * len(CATS) + "---:|")
        for name, r in locomo.items():
            if (part, "all", 10) not in r:
                continue
            cells = " | ".join(f"{r[(part, c, 5)]:.3f} / {r[(part, c, 10)]:.3f}" for c in CATS)
            print(f"| {name} | {r[(part, 'all', 5)]:.3f} | {r[(part, 'all', 10)]:.3f} | {cells} "
                  f"| {r['ms']:.2f} / {r['p50']:.2f} / {r['cpu_p50']:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, 2 conversations, no MiniLM")
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--no-minilm", action="store_true")
    ap.add_argument("--no-scale", action="store_true", help="skip the latency and insert measures")
    ap.add_argument("--only", default="", help="LoCoMo methods whose name contains one of these comma-separated words")
    args = ap.parse_args()

    sizes = () if args.no_scale else (2_000, 10_000) if args.quick else (10_000, 100_000)
    print("## search latency (top-10, one subject, dim 384) and insert throughput into a store file", flush=True)
    scale = []
    for n in sizes:
        row = bench_scale(n, queries=50 if args.quick else 200)
        scale.append(row)
        print(f"  n={n}: vector top-10 p50 {row['vec_p50']:.2f} ms p95 {row['vec_p95']:.2f} ms | search() p50 "
              f"{row['search_p50']:.2f} p95 {row['search_p95']:.2f} | recall p50 {row['recall_p50']:.2f} | bulk "
              f"{row['bulk_per_s']:.0f}/s, single {row['single_per_s']:.0f}/s | open + first search {row['load_s']:.2f} s", flush=True)

    locomo = {}
    if args.data.is_file():
        convs = load_locomo(args.data, 2 if args.quick else None)
        nq = sum(len(q) for _, _, q in convs)
        print(f"\n## LoCoMo evidence recall ({len(convs)} conversations, {nq} questions, categories 1-4)", flush=True)
        methods = locomo_methods(args.quick, args.no_minilm)
        if args.only:
            methods = {k: v for k, v in methods.items() if any(w.strip() in k for w in args.only.split(","))}
        locomo = eval_locomo(convs, methods)
    else:
        print(f"\n(LoCoMo skipped: no data at {args.data})")

    print("\n## summary\n")
    if scale:
        print("| records | vector top-10 p50 / p95 (ms) | search() p50 / p95 (ms) | recall=True p50 (ms) | bulk insert into a file /s | single insert /s |")
        print("|---:|---:|---:|---:|---:|---:|")
        for r in scale:
            print(f"| {r['n']:,} | {r['vec_p50']:.2f} / {r['vec_p95']:.2f} | {r['search_p50']:.2f} / {r['search_p95']:.2f} "
                  f"| {r['recall_p50']:.2f} | {r['bulk_per_s']:,.0f} | {r['single_per_s']:,.0f} |")
    if locomo:
        print_locomo(locomo)


if __name__ == "__main__":
    main()
