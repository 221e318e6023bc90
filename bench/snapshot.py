"""Top-1 similar-run search (load_snapshot's lookup) over 10k and 100k stored runs.

    python bench/snapshot.py [--sizes 10000,100000] [--queries 200]

Run queries are synthetic support questions embedded with the built-in hashing
embedder (dim 384) and written as `run_embeddings` rows; the search is exact
(brute-force cosine over an in-process matrix). Prints the one-off matrix load
time and p50/p95 per query; goal: ≤ 10 ms at 100k. Asserts nothing.
"""
from __future__ import annotations

import argparse
import atexit
import os
import shutil
import random
import statistics
import sys
import tempfile
import time


sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tracemem.memory import HashingEmbedder  # noqa: E402
from tracemem.store import Store  # noqa: E402
from tracemem.store.write.rows import Batch  # noqa: E402

TOPICS = ["refund", "invoice", "password", "shipping", "plan", "laptop", "warranty", "login", "upgrade", "delivery",
          "billing", "account", "printer", "battery", "screen", "keyboard", "license", "discount", "order", "return"]
ASKS = ["how do I", "can I", "why can't I", "when will I", "is it possible to", "what happens if I", "help me"]
VERBS = ["get a", "change my", "cancel my", "reset my", "track my", "fix my", "renew my", "transfer my"]


def question(rng: random.Random) -> str:
    return f"{rng.choice(ASKS)} {rng.choice(VERBS)} {rng.choice(TOPICS)} {rng.choice(TOPICS)} #{rng.randint(1, 10**6)}"


def fill(store: Store, n: int, embedder: HashingEmbedder, rng: random.Random) -> float:
    start = time.perf_counter()
    for lo in range(0, n, 10_000):
        texts = [question(rng) for _ in range(min(10_000, n - lo))]
        vectors = embedder.embed(texts)
        batch = Batch()
        now = time.time_ns()
        batch.add_embeddings([(f"r{lo + i:08d}", "support", embedder.embedder_id, t, v.tolist(), now + i)
                              for i, (t, v) in enumerate(zip(texts, vectors))])
        store.writer.commit(batch)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--queries", type=int, default=200)
    args = ap.parse_args()
    embedder = HashingEmbedder()
    rng = random.Random(7)
    print("## load_snapshot lookup: exact top-1 over stored runs (hashing embedder, dim 384); goal ≤ 10 ms at 100k")
    print(f"{'runs':>8} {'fill s':>7} {'matrix load ms':>15} {'p50 ms':>7} {'p95 ms':>7}")
    for size in (int(s) for s in args.sizes.split(",")):
        folder = tempfile.mkdtemp(prefix="tracemem-snap-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        store = Store(os.path.join(folder, "snap.duckdb"))
        fill_s = fill(store, size, embedder, rng)
        queries = [question(rng) for _ in range(args.queries)]
        start = time.perf_counter()
        store.similar_runs("support", queries[0], min_score=0.0)
        load_ms = (time.perf_counter() - start) * 1000
        times = []
        for q in queries:
            start = time.perf_counter()
            hits = store.similar_runs("support", q, top_k=1, min_score=0.0)
            times.append((time.perf_counter() - start) * 1000)
            assert hits
        times.sort()
        p95 = times[int(0.95 * (len(times) - 1))]
        print(f"{size:>8} {fill_s:>7.1f} {load_ms:>15.1f} {statistics.median(times):>7.2f} {p95:>7.2f}")
        store.close()


if __name__ == "__main__":
    main()
