"""File growth when every model call's exact request is recorded: a 1,000-turn thread, linear or not.

One run per turn on one thread (`resume=` the previous run), each turn a `call_model` stage
that sends the model a system prompt, the whole conversation so far and a new 200-character
message, and gets a 200-character reply (different words every turn, as bench/peers.py's
distinct-text chat: repeated text would flatter a compressing store). Every call is recorded
with its exact request (tracemem/exchange.py: each message once, a call names chains of them).

Prints the bytes added to the DuckDB file at 50/100/200/500/1,000 turns and the fitted growth
exponent (1 = linear, 2 = the square of the turns), beside: the same chat recorded without a
model call (bench/peers.py's tracemem row, the 500-turn 0.79 MB of bench/RESULTS.md), and what
storing every request whole would hold (the characters of every request's messages, summed: what
a call keeping its own copy of the history would write). Also the ms per turn at the start and
the end of the thread (each call still hashes the whole history it sends).

    python bench/model_requests.py [--turns 1000] [--dir PATH]

Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.peers import answer, text, tracemem_chat  # noqa: E402
from bench.store import file_bytes, growth_exponent  # noqa: E402
from stages import AgentScope, call_model  # noqa: E402
from tracemem import Pipeline  # noqa: E402
from tracemem.models import ScriptedModel  # noqa: E402
from tracemem.models.messages import wire_messages  # noqa: E402
from tracemem.store import Store  # noqa: E402

SYSTEM = "You are a helpful assistant. Answer in one short paragraph."


class EchoModel(ScriptedModel):
    """Replies with bench/peers.py's `answer` to the last user message (200 characters, different every turn),
    and keeps the size of every request it was sent."""

    def __init__(self) -> None:
        super().__init__(name="echo")
        self.request_chars: list[int] = []

    def complete(self, messages, **options):  # type: ignore[no-untyped-def]
        self.request_chars.append(len(json.dumps(wire_messages(messages))))
        self.replies = [answer(messages[-1]["content"])]
        self._cursor = 0
        return super().complete(messages, **options)


def thread(turns: int, folder: str, marks: tuple[int, ...]) -> tuple[list[tuple[int, int]], EchoModel, list[float]]:
    flow = Pipeline("chat", AgentScope).then(call_model()).build()
    model = EchoModel()
    store = Store(os.path.join(folder, "requests.duckdb"), snapshot_embedder=None)  # (as the peers.py chat: no
    # query embeddings, which this pipeline's question would otherwise get: 1.6 KB a run)
    sizes = [(0, file_bytes(store))]
    times: list[float] = []
    previous = None
    for turn in range(1, turns + 1):
        started = time.perf_counter()
        previous = flow.run({"question": text(turn), "prompt": SYSTEM}, resume=previous, store=store,
                            env={"model": model})
        times.append(time.perf_counter() - started)
        if turn in marks:
            sizes.append((turn, file_bytes(store)))
    [request] = store.requests(previous.run_id).values()
    assert len(request.messages) == 2 * turns - 1 and not request.missing, "the last call's request is not whole"
    counts = store.sql("SELECT (SELECT count(*) FROM messages), (SELECT count(*) FROM message_chains)").fetchall()[0]
    print(f"rows: {counts[0]:,} messages, {counts[1]:,} chain links for {turns:,} calls")
    with store.lock:  # where the file's blocks went (DuckDB's own accounting; free blocks are reused later)
        used = {t: store.con.execute(f"SELECT count(DISTINCT block_id) FROM pragma_storage_info('{t}') "
                                     f"WHERE block_id >= 0").fetchall()[0][0]
                for t in ("runs", "steps", "writes", "reads", "model_calls", "messages", "message_chains")}
        size = store.con.execute("PRAGMA database_size").fetchall()[0]
    print(f"blocks of {size[2]:,} bytes: {size[3]:,} in all, {size[5]:,} free; by table: "
          + ", ".join(f"{t} {n}" for t, n in used.items()))
    store.close()
    return sizes, model, times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=1000)
    ap.add_argument("--dir", default=None, help="where the files go (default: a temporary folder)")
    args = ap.parse_args()
    folder = args.dir or tempfile.mkdtemp(prefix="tracemem-requests-")
    marks = tuple(m for m in (50, 100, 200, 500) if m < args.turns) + (args.turns,)
    print(f"## {args.turns:,}-turn thread, every model call's exact request recorded "
          f"(200-character message and reply per turn, distinct text)")
    sizes, model, times = thread(args.turns, folder, marks)
    chat = tracemem_chat(args.turns, folder, marks)
    whole = [sum(model.request_chars[:t]) for t, _ in sizes[1:]]
    print("bytes added to the file since the empty store, at turn:")
    print(f"{'':44}" + "".join(f"{t:>13,}" for t, _ in sizes[1:]) + "  exponent")
    for label, points in (("with exact requests (model call per turn)", sizes),
                          ("the chat without a model call (peers.py)", chat)):
        print(f"{label:44}" + "".join(f"{b - points[0][1]:>13,}" for _, b in points[1:])
              + f"  {growth_exponent(points):8.2f}")
    print(f"{'every request stored whole (characters)':44}" + "".join(f"{w:>13,}" for w in whole)
          + f"  {growth_exponent([(0, 0)] + [(t, w) for (t, _), w in zip(sizes[1:], whole)]):8.2f}")
    added = sizes[-1][1] - sizes[0][1]
    print(f"with exact requests: {added / 1e6:.2f} MB added over {args.turns:,} turns "
          f"(exponent {growth_exponent(sizes):.2f}); without model calls {(chat[-1][1] - chat[0][1]) / 1e6:.2f} MB; "
          f"whole requests would be {whole[-1] / 1e6:.1f} MB of text")
    first, last = (statistics.median(times[:50]) * 1e3, statistics.median(times[-50:]) * 1e3)
    print(f"ms per turn (median): turns 1-50 {first:.2f}, the last 50 {last:.2f}")


if __name__ == "__main__":
    main()
