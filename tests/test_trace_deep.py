"""Backtracking has no depth limit of Python's own: a value that depends on thousands of steps in a chain, or a
fork of a fork of … a fork, is walked and explained with loops, never recursion; and the viewer shows it (or
says why it cannot) on a page, never as a bare 500. Real runs on real store files."""
from __future__ import annotations

import json
import re
import sys

from pydantic import BaseModel
from starlette.testclient import TestClient

from tracemem import Pipeline
from tracemem.store import Store
from tracemem.ui import create_app

ROUNDS = 3000  # above Python's default recursion limit (1,000 frames); 6,001 steps: the viewer reads it by blocks


class Count(BaseModel):
    n: int = 0
    answer: str = ""


def bump(s: Count) -> None:
    s.n += 1


def more(s: Count) -> bool:
    return s.n < ROUNDS


def finish(s: Count) -> None:
    s.answer = f"counted {s.n}"


CHAIN = (Pipeline("chain", Count, max_iterations=ROUNDS + 5).then(bump)
         .loop_to("bump", when=more, max_iterations=ROUNDS + 5).then(finish).build())


def test_a_chain_of_thousands_of_steps_is_walked_and_explained(tmp_path):
    path = str(tmp_path / "chain.duckdb")
    with Store(path) as store:
        run = CHAIN.run({}, store=store)
    limit = sys.getrecursionlimit()
    with Store(path, read_only=True) as store:
        trace = store.run(run.run_id).backtrack("answer", max_depth=100_000, max_nodes=20_000)
        writes = [n for n, d in trace.graph.nodes(data=True) if d.get("kind") == "write" and d.get("path") == "n"]
        assert len(writes) == ROUNDS and not trace.truncated
        text = trace.explain(max_lines=100_000)
        lines = text.splitlines()
        assert lines[0].startswith(f"answer = counted {ROUNDS}") and len(lines) > ROUNDS
        assert any(line.strip().startswith("← n = 1 ") for line in lines)  # the first round, at the bottom
    assert sys.getrecursionlimit() == limit  # nothing raised it
    web = TestClient(create_app(path), base_url="http://127.0.0.1")
    page = web.get(f"/runs/{run.run_id}/backtrack", params={"path": "answer", "depth": 100_000, "nodes": 20_000})
    assert page.status_code == 200 and f"counted {ROUNDS}" in page.text
    data = web.get(f"/runs/{run.run_id}/backtrack.json", params={"path": "answer", "depth": 100_000,
                                                                 "nodes": 20_000}).json()
    assert len(data["nodes"]) > ROUNDS


def test_a_long_runs_pages_are_bounded_and_show_more_on_request(tmp_path):
    path = str(tmp_path / "chain.duckdb")
    with Store(path) as store:
        run = CHAIN.run({}, store=store)
    web = TestClient(create_app(path), base_url="http://127.0.0.1")
    page = web.get(f"/runs/{run.run_id}", params={"at": 3001}).text
    assert 'id="step-3001"' in page and 'id="step-2999"' not in page and 'id="step-3201"' not in page
    pager = re.search(r'<nav class="pager steps-pager">(.*?)</nav>', page, re.S).group(1)
    assert pager.count("<a ") <= 2 * 5 + 2 and pager.count("…") == 2 and "<strong>3001–3200</strong>" in pager
    assert "6001–6001" in pager  # the last page, however far
    capped = web.get(f"/runs/{run.run_id}", params={"stages": 1}).text
    assert "2 more stages not drawn" in capped and capped.count('data-node="') == 1
    more = re.search(r'href="\?([^"]+)" id="show-more-stages"', capped).group(1).replace("&amp;", "&")
    assert "stages=2" in more
    assert "1 more stages not drawn" in web.get(f"/runs/{run.run_id}?{more}").text
    assert "more stages not drawn" not in web.get(f"/runs/{run.run_id}").text
    full = web.get(f"/runs/{run.run_id}/backtrack", params={"path": "answer", "full": 1, "depth": 100_000,
                                                           "nodes": 20_000}).text
    hidden = int(re.search(r'id="graph-hidden">(\d+) nodes', full).group(1))
    link = re.search(r'href="\?([^"]+)" id="show-more-nodes"', full).group(1).replace("&amp;", "&")
    assert "drawn=600" in link
    wider = web.get(f"/runs/{run.run_id}/backtrack?{link}").text
    assert int(re.search(r'id="graph-hidden">(\d+) nodes', wider).group(1)) == hidden - 300


class Cart(BaseModel):
    items: list[dict] = []
    rate: float = 0.1
    subtotal: float = 0.0
    total: float = 0.0


def fill(s: Cart) -> None:
    s.items.append({"price": 80.0})
    s.items.append({"price": 20.0})


def add_up(s: Cart) -> None:
    s.subtotal = sum(i["price"] for i in s.items)


def discount(s: Cart) -> None:
    s.total = round(s.subtotal * (1 - s.rate), 2)


CART = Pipeline("cart", Cart).then(fill).then(add_up).then(discount).build()


def test_a_fork_of_a_fork_of_a_fork_traces_into_the_first_run(tmp_path):
    with Store(str(tmp_path / "forks.duckdb")) as store:
        original = CART.run(store=store)
        run = CART.fork(original.run_id, "add_up", edits={"rate": 0.5}, store=store)
        for i in range(40):  # each a fork of the last, just after its edit: items and subtotal are the original's
            run = CART.fork(run.run_id, 1, edits={"rate": round(0.01 * i, 2)}, store=store)
        store.flush()
        last = store.run(run.run_id)
        subtotal = last.backtrack("subtotal")
        assert subtotal.graph.nodes[subtotal.root]["run_id"] == original.run_id
        element = last.backtrack("items[1]")
        produced = element.graph.nodes[element.root]
        assert (produced["run_id"], produced["verb"], json.loads(produced["value"])) == (
            original.run_id, "append", {"price": 20.0})
        total = last.backtrack("total")
        assert original.run_id in total.runs() and "subtotal = 100.0" in total.explain()
