"""Big memories: a store file with 100k and 1M records in one subject, measured in fresh processes.

Prints figures; asserts nothing. Usage:

    python bench/memory_scale.py              # 100k and 1M records (builds both, time-boxed)
    python bench/memory_scale.py --smoke      # 1k and 3k records: checks the script, not the speed
    python bench/memory_scale.py --big 300000 --budget 300

Each store is built once per run with `remember_many` into a DuckDB file (the
hashing embedder, batches of 5,000: embedding a million texts with MiniLM, the
default where installed, would take about an hour on two cores), then closed, which writes the
index files. Every measure after that runs in a new Python process: open the
store, time the first search (that is what a user waits for), then 200
searches, then read the process's resident memory. The texts are synthetic
(Zipf-distributed invented words mixed with stopwords), generated from a seed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SYLLABLES = ["ka", "lo", "mi", "ren", "to", "sa", "vi", "del", "ar", "on", "pe", "ist", "ul", "gra", "ne", "bo",
             "tish", "ma", "cor", "fen", "li", "ous", "ra", "ting", "ber", "sco", "da", "nel", "wy", "quo"]
FILLERS = ["the", "a", "to", "and", "of", "i", "my", "we", "was", "is", "it", "that", "with", "for", "on", "at",
           "she", "he", "you", "our"]
BATCH = 5_000
SUBJECT = "user-1"


def texts(n: int, seed: int = 0, n_words: int = 50_000) -> list[str]:
    """`n` sentences of 6-13 words: Zipf-distributed invented words, 30% fillers."""
    rng = np.random.default_rng(seed)
    k = rng.integers(2, 5, size=3 * n_words)
    idx = rng.integers(0, len(SYLLABLES), size=(3 * n_words, 4))
    vocab = list(dict.fromkeys("".join(SYLLABLES[j] for j in row[:kk]) for row, kk in zip(idx, k)))[:n_words]
    rng.shuffle(vocab)
    words = vocab + FILLERS
    p = 1 / np.arange(1, len(vocab) + 1) ** 1.05
    lens = rng.integers(6, 14, size=n)
    total = int(lens.sum())
    picks = np.where(rng.random(total) < 0.3, len(vocab) + rng.integers(0, len(FILLERS), size=total),
                     rng.choice(len(vocab), size=total, p=p / p.sum()))
    flat = [words[j] for j in picks.tolist()]
    out, at = [], 0
    for size in lens.tolist():
        out.append(" ".join(flat[at:at + size]))
        at += size
    return out


def rss_mb() -> tuple[float, float, float, float]:
    """Resident, peak resident, anonymous and file-backed resident memory of this process (MB), from /proc."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return tuple(int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM", "RssAnon", "RssFile"))  # type: ignore


def minilm_query_ms(queries: list[str]) -> float | None:
    """p50 of embedding one query with the default MiniLM (None where it is not installed)."""
    from tracemem.memory import EmbedderUnavailableError, MiniLMEmbedder

    try:
        model = MiniLMEmbedder()
    except EmbedderUnavailableError:
        return None
    for q in queries[:10]:
        model.embed([q])
    times = []
    for q in queries:
        t0 = time.perf_counter()
        model.embed([q])
        times.append(1000 * (time.perf_counter() - t0))
    return statistics.median(times)


# -- child processes ----------------------------------------------------------------------
def child_build(db: str, n: int, budget: float) -> dict:
    from tracemem.memory import HashingEmbedder
    from tracemem.store import Store

    data = texts(n)
    store = Store(db, embedder=HashingEmbedder())  # a million MiniLM embeddings would take an hour here
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    done = 0
    for start in range(0, n, BATCH):
        store.memory.remember_many({"subject": SUBJECT, "text": t} for t in data[start:start + BATCH])
        done = min(n, start + BATCH)
        if time.perf_counter() - t0 > budget:
            break
    insert_s = time.perf_counter() - t0
    insert_cpu_s = time.process_time() - cpu0
    t1 = time.perf_counter()
    store.close()  # checkpoints DuckDB and writes the index files
    return {"n": done, "insert_s": insert_s, "insert_cpu_s": insert_cpu_s, "close_s": time.perf_counter() - t1, "rss": rss_mb()}


def child_search(db: str, n_queries: int, check_exact: int) -> dict:
    t0 = time.perf_counter()
    from tracemem.store import Store

    rng = np.random.default_rng(7)
    pool = texts(2_000, seed=0)  # the first records' words, so queries match something
    queries = [" ".join(rng.choice(pool[i].split(), size=min(4, len(pool[i].split())), replace=False))
               for i in rng.integers(0, len(pool), size=n_queries + 1)]
    t_import = time.perf_counter() - t0
    t1 = time.perf_counter()
    store = Store(db)
    t_open = time.perf_counter() - t1
    t2 = time.perf_counter()
    first = store.memory.search(SUBJECT, queries[0], recall=True)
    t_first = time.perf_counter() - t2
    times, rec_times = [], []
    cpu0 = time.process_time()
    for q in queries[1:]:
        t = time.perf_counter()
        store.memory.search(SUBJECT, q)
        times.append(time.perf_counter() - t)
        t = time.perf_counter()
        store.memory.search(SUBJECT, q, recall=True)
        rec_times.append(time.perf_counter() - t)
    cpu_ms = 1000 * (time.process_time() - cpu0) / (2 * len(times))  # both threads of DuckDB and numpy count
    rss, peak, anon, mapped = rss_mb()
    out = {"anon_mb": anon, "file_mb": mapped, "cpu_ms": cpu_ms,"open_s": t_open, "first_s": t_first, "import_s": t_import, "scan": first.scan,
           "count": "estimated" if first.count_estimated else "exact",
           "p50_ms": 1000 * statistics.median(times), "p95_ms": 1000 * float(np.percentile(times, 95)),
           "recall_p50_ms": 1000 * statistics.median(rec_times), "rss_mb": rss, "peak_mb": peak,
           "rebuilt": store.memory.rebuilt_subjects, "records": store.memory.shard(SUBJECT).live_count()}
    if check_exact:  # the int8 scan against a float32 scan of the same shard: top-10 recall, candidate counts
        shard = store.memory.shard(SUBJECT)
        hits, diffs = 0, []
        for q in queries[1:check_exact + 1]:
            a = store.memory.search(SUBJECT, q, limit=10)
            saved, shard.vecs.int8_min_rows = shard.vecs.int8_min_rows, 10**12
            b = store.memory.search(SUBJECT, q, limit=10)
            shard.vecs.int8_min_rows = saved
            hits += len({r.memory_id for r in a.records} & {r.memory_id for r in b.records})
            diffs.append(abs(a.total_before_filter - b.total_before_filter) / max(1, b.total_before_filter))
        out["recall_vs_float32"] = hits / (10 * check_exact)
        out["count_diff"] = float(np.mean(diffs))
        out["scan_recall"] = first.scan_recall
    store.close()
    return out


def spawn(*args: str, timeout: float = 3600) -> dict:
    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"))
    if proc.returncode != 0:
        raise SystemExit(f"child {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- the run ----------------------------------------------------------------------------------
def measure(folder: Path, n: int, budget: float, queries: int, check_exact: int) -> dict:
    db = str(folder / f"mem{n}.duckdb")
    t0 = time.perf_counter()
    built = spawn("--child", "build", "--db", db, "--n", str(n), "--budget", str(budget))
    built["build_s"] = time.perf_counter() - t0
    size = sum(f.stat().st_size for f in folder.glob(f"mem{n}.duckdb*") if f.is_file())
    size += sum(f.stat().st_size for f in (folder / f"mem{n}.duckdb.memindex").glob("*"))
    print(f"  built {built['n']:,} records in {built['build_s']:.1f} s (inserts {built['insert_s']:.1f} s = "
          f"{built['n'] / built['insert_s']:,.0f}/s; {built['n'] / built['insert_cpu_s']:,.0f} per CPU-second), close {built['close_s']:.1f} s), files {size / 1e6:,.0f} MB",
          flush=True)
    opened = spawn("--child", "search", "--db", db, "--queries", str(queries), "--check-exact", str(check_exact))
    print(f"  fresh process: open {1000 * opened['open_s']:.0f} ms, first search {1000 * opened['first_s']:.0f} ms, "
          f"search p50 {opened['p50_ms']:.2f} ms p95 {opened['p95_ms']:.2f} ms, CPU {opened['cpu_ms']:.1f} ms/search "
          f"(recall=True p50 "
          f"{opened['recall_p50_ms']:.2f}), scan {opened['scan']} (match count {opened['count']}), RSS {opened['rss_mb']:,.0f} MB (peak "
          f"{opened['peak_mb']:,.0f}; anonymous {opened['anon_mb']:,.0f}, mapped files {opened['file_mb']:,.0f}), rebuilt {opened['rebuilt'] or 'nothing'}"
          + (f"; {opened['scan']} scan against float32 on {check_exact} queries: top-10 recall "
             f"{opened['recall_vs_float32']:.3f}, matching-count difference {100 * opened['count_diff']:.2f}% "
             f"(recall stored at save: {opened['scan_recall']})" if "recall_vs_float32" in opened else ""), flush=True)
    return {**built, **opened}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="1k and 3k records: checks the script runs")
    ap.add_argument("--small", type=int, default=100_000)
    ap.add_argument("--big", type=int, default=1_000_000)
    ap.add_argument("--budget", type=float, default=900, help="seconds of inserts allowed per store")
    ap.add_argument("--keep", type=Path, help="build the stores in this folder and keep them")
    ap.add_argument("--child", choices=["build", "search"])
    ap.add_argument("--db")
    ap.add_argument("--n", type=int)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--check-exact", type=int, default=0)
    args = ap.parse_args()
    if args.child == "build":
        print(json.dumps(child_build(args.db, args.n, args.budget)))
        return
    if args.child == "search":
        print(json.dumps(child_search(args.db, args.queries, args.check_exact)))
        return
    small, big = (1_000, 3_000) if args.smoke else (args.small, args.big)
    queries = 10 if args.smoke else 200
    folder = args.keep or Path(tempfile.mkdtemp(prefix="tracemem-memscale-"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"## memory at scale: one subject, hashing embedder, store files in {folder}")
    print(f"   load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (wall-clock figures stretch with it)",
          flush=True)
    try:
        rows = {}
        for n in (small, big):
            print(f"\n### {n:,} records", flush=True)
            rows[n] = measure(folder, n, args.budget, queries, check_exact=min(20, queries) if n == big else 0)
    finally:
        if args.keep is None:
            shutil.rmtree(folder, ignore_errors=True)
    s, b = rows[small], rows[big]
    minilm_ms = None if args.smoke else minilm_query_ms(texts(queries, seed=7))
    print(f"\n## summary ({'smoke sizes, figures mean nothing' if args.smoke else 'fresh processes'})\n")
    print("| measure | result | goal |")
    print("|---|---:|---:|")
    print(f"| first search after open, {s['n']:,} records | {1000 * (s['open_s'] + s['first_s']):,.0f} ms "
          f"(open {1000 * s['open_s']:.0f} + search {1000 * s['first_s']:.0f}) | ≤ 200 ms at 100k |")
    print(f"| first search after open, {b['n']:,} records | {1000 * (b['open_s'] + b['first_s']):,.0f} ms "
          f"(open {1000 * b['open_s']:.0f} + search {1000 * b['first_s']:.0f}) | ≤ 2 s at 1M |")
    print(f"| search p50 / p95, {b['n']:,} records | {b['p50_ms']:.2f} / {b['p95_ms']:.2f} ms (scan {b['scan']}; "
          f"CPU {b['cpu_ms']:.1f} ms per search) | p50 ≤ 10 ms |")
    if "recall_vs_float32" in b:
        print(f"| {b['scan']} scan: top-10 recall against float32, {b['n']:,} records | {b['recall_vs_float32']:.3f} "
              f"(count of matches differs by {100 * b['count_diff']:.2f}%) | exact preferred |")
    print(f"| RSS after {2 * queries} searches, {b['n']:,} records | {b['rss_mb']:,.0f} MB (peak {b['peak_mb']:,.0f}) "
          f"| ≤ 2 GB |")
    print(f"| bulk remember_many into a file, {b['n']:,} records | {b['n'] / b['insert_s']:,.0f} records/s "
          f"({b['n'] / b['insert_cpu_s']:,.0f} per CPU-second); {b['n'] / (b['insert_s'] + b['close_s']):,.0f}/s "
          f"with close | ≥ 20k records/s |")
    if minilm_ms is not None:
        print(f"| MiniLM query embedding p50 (ONNX Runtime, 1 thread), added to each search of a MiniLM store | "
              f"{minilm_ms:.2f} ms (search p50 + it: {b['p50_ms'] + minilm_ms:.2f} ms) | p50 ≤ 10 ms in all |")
    print(f"| build of the {b['n']:,}-record store (time-boxed at {args.budget:.0f} s of inserts) | "
          f"{b['build_s']:.1f} s | once per run |")


if __name__ == "__main__":
    main()
