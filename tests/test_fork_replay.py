"""`flow.fork` (time travel from any recorded step, with edits and lineage), `run.diff`, and replay of
recorded model replies (`ReplayModel`, `replay=True`), counted against a real local chat server."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pydantic import BaseModel

from tracemem import Pipeline, ReplayModel, ResumeError
from tracemem.flow.replay import ReplayMissError, request_hash
from tracemem.models import OpenAICompatibleModel, ScriptedModel
from tracemem.scope.diff import MISSING, Change
from tracemem.store import Store

from local_chat import serve


@pytest.fixture
def chat():
    yield from serve()


@pytest.fixture
def store(tmp_path):
    with Store(str(tmp_path / "f.duckdb")) as s:
        yield s


# -- a flow with every kind of node: where a fork continues must match where the run went ----------------

class W(BaseModel):
    n: int = 0
    trail: list[str] = []
    left: str = ""
    right: str = ""
    shout: str = ""
    done: str = ""


class Echo(BaseModel):
    text: str = ""
    loud: str = ""


def louder(s):
    s.loud = s.text.upper()


echo = Pipeline("echo", Echo).then(louder).build()


def start(s):
    s.trail.append("start")


def tick(s):
    s.n += 1
    s.trail.append(f"tick{s.n}")


def route(s):
    return "again" if s.n < 3 else "on"


def settle(s):
    s.trail.append("settled")


def side_a(s):
    s.left = f"a{s.n}"


def side_b(s):
    s.right = f"b{s.n}"


def step_up(s, ctx):
    s.n += 10
    if s.n > 40:
        ctx.break_loop("big enough")


def pick(s):
    return "even" if s.n % 2 == 0 else "odd"


def even(s):
    s.done = f"even {s.n}"


def odd(s):
    s.done = f"odd {s.n}"


every_kind = (Pipeline("kinds", W).then(start).then(tick)
              .branch(route, {"again": "tick", "on": settle})
              .fork(side_a, side_b, id="both")
              .then(step_up).loop_to("step_up", when=lambda s: s.n < 100, max_iterations=5)
              .subflow(echo, inputs={"text": "left"}, outputs={"shout": "loud"}, id="echoing")
              .branch(pick, {"even": even, "odd": odd})
              .build())


def test_a_fork_after_any_step_continues_exactly_where_the_run_went(store):
    ref = every_kind.run(store=store)
    assert ref.ok and ref.output.done == "odd 43" and ref.output.shout == "A3"
    after = {s.step: [(t.stage, t.iteration) for t in ref.steps if t.step > s.step] for s in ref.steps}
    after[0] = [(t.stage, t.iteration) for t in ref.steps]
    branches = {s.step for s in ref.steps if s.kind == "fork-branch"}
    for k in sorted(after):
        if k in branches and k + 1 in branches:  # the first of the fork's two branches: not a place to stop
            with pytest.raises(ResumeError, match="is one branch of fork 'both'.*continue after step"):
                every_kind.fork(ref.run_id, k, store=store)
            continue
        fork = every_kind.fork(ref.run_id, k, store=store)
        assert fork.ok, (k, fork.error)
        assert [(t.stage, t.iteration) for t in fork.steps] == after[k], k
        assert fork.diff(ref) == [], k
        assert (fork.forked_from_run_id, fork.forked_from_step) == (ref.run_id, k)


# -- edits, lineage, backtracking into the original --------------------------------------------------------

class Cart(BaseModel):
    items: list[dict[str, float]] = []
    rate: float = 0.1
    subtotal: float = 0
    total: float = 0
    note: str = ""


def fill(s):
    s.items.append({"price": 80.0})
    s.items.append({"price": 20.0})


def add_up(s):
    s.subtotal = sum(i["price"] for i in s.items)


def discount(s):
    s.total = round(s.subtotal * (1 - s.rate), 2)


def describe(s):
    s.note = f"{len(s.items)} items, {s.total} to pay"


cart = Pipeline("cart", Cart).then(fill).then(add_up).then(discount).then(describe).build()


def test_a_fork_with_an_edit_changes_what_follows_and_backtracks_into_the_original(store, tmp_path):
    original = cart.run(store=store)
    assert original.output.total == 90.0
    fork = cart.fork(original.run_id, "add_up", edits={"rate": 0.5}, store=store)
    assert fork.ok and fork.output.total == 50.0 and fork.output.note == "2 items, 50.0 to pay"
    assert [(s.step, s.stage, s.kind) for s in fork.steps] == [
        (1, "(edit)", "edit"), (2, "discount", "stage"), (3, "describe", "stage")]
    assert fork.diff(original) == [Change("rate", 0.5, 0.1), Change("total", 50.0, 90.0),
                                   Change("note", "2 items, 50.0 to pay", "2 items, 90.0 to pay")]
    store.flush()
    assert store.sql("SELECT forked_from_run_id, forked_from_step FROM runs WHERE run_id = ?",
                     [fork.run_id]).fetchall() == [(original.run_id, 2)]
    assert store.sql("SELECT path, value FROM writes WHERE run_id = ? AND step = 1",
                     [fork.run_id]).fetchall() == [("rate", "0.5")]

    with Store(store.path, read_only=True, snapshot_if_locked=True) as other:  # from the file, as loaded
        loaded = other.run(fork.run_id)
        trace = loaded.backtrack("total")
        text = trace.explain()
        assert f"rate = 0.5  (edit, run {fork.run_id[:8]} step 1: fork of run {original.run_id[:8]} after step 2)" in text
        assert f"subtotal = 100.0  (run {original.run_id[:8]} step 2, add_up)" in text  # set before the fork point
        assert f"items += {{\"price\": 80.0}}  (run {original.run_id[:8]} step 1, fill)" in text
        assert trace.runs() == [fork.run_id, original.run_id]
        element = loaded.backtrack("items[1]")
        produced = element.graph.nodes[element.root]
        assert (produced["run_id"], produced["step"], produced["verb"], json.loads(produced["value"])) == (
            original.run_id, 1, "append", {"price": 20.0})
        untouched = loaded.backtrack("subtotal")  # never written in the fork: its value came from the original
        assert untouched.missing is None and untouched.graph.nodes[untouched.root]["run_id"] == original.run_id
        assert loaded.diff(other.run(original.run_id))[0] == Change("rate", 0.5, 0.1)


def test_fork_edits_are_validated_like_writes_and_steps_must_exist(store):
    original = cart.run(store=store)
    with pytest.raises(ResumeError, match="fork edit rate = 'lots' is invalid: Input should be a valid number"):
        cart.fork(original.run_id, 1, edits={"rate": "lots"}, store=store)
    with pytest.raises(ResumeError, match="fork edit colour = 'red' is invalid: the scope Cart has no field 'colour'"):
        cart.fork(original.run_id, 1, edits={"colour": "red"}, store=store)
    with pytest.raises(ResumeError, match="has no step 9 to fork after; its steps: 1:fill, 2:add_up"):
        cart.fork(original.run_id, 9, store=store)
    nested = cart.fork(original.run_id, "fill", edits={"items[0].price": 10.0}, store=store)
    assert nested.output.total == 27.0 and nested.diff(original)[0] == Change("items[0].price", 10.0, 80.0)
    assert cart.fork(original.run_id, 0, store=store).diff(original) == []
    assert every_kind.run().diff(cart.run())[0].theirs is MISSING
    with pytest.raises(ResumeError, match="is a run of 'cart', not of 'kinds'"):
        every_kind.fork(original.run_id, 1, store=store)
    assert store.sql("SELECT count(*) FROM runs WHERE forked_from_run_id IS NOT NULL").fetchall() == [(2,)]


# -- replay ------------------------------------------------------------------------------------------------

class Brief(BaseModel):
    a: str = ""
    b: str = ""
    sum_a: str = ""
    sum_b: str = ""
    brief: str = ""


def summarise_a(s, ctx):
    s.sum_a = ctx.complete(ctx.env["model"], [{"role": "user", "content": f"summarise {s.a}"}]).text


def summarise_b(s, ctx):
    s.sum_b = ctx.complete(ctx.env["model"], [{"role": "user", "content": f"summarise {s.b}"}]).text


def combine(s):
    s.brief = f"{s.sum_a} | {s.sum_b}"


briefing = Pipeline("brief", Brief).then(summarise_a).then(summarise_b).then(combine).build()


def test_a_fork_with_replay_calls_the_model_only_for_the_prompt_an_edit_changed(store, chat):
    env = {"model": OpenAICompatibleModel(chat.url, "m1", max_retries=0)}
    original = briefing.run({"a": "tides", "b": "moons"}, store=store, env=env)
    assert len(chat.requests) == 2

    same = briefing.fork(original.run_id, 0, store=store, env=env, replay=True)
    assert len(chat.requests) == 2  # no live call: every prompt was asked before
    assert same.diff(original) == []
    assert [r["replayed"] for r in same.rows["model_calls"]] == [True, True]

    edited = briefing.fork(original.run_id, 0, edits={"b": "comets"}, store=store, env=env, replay=True)
    assert chat.asked()[2:] == ["summarise comets"]  # exactly one live call: the prompt the edit changed
    assert edited.output.brief == "re: summarise tides | re: summarise comets"
    assert [(r["step"], r["replayed"]) for r in edited.rows["model_calls"]] == [(2, True), (3, False)]

    live = briefing.fork(original.run_id, 0, store=store, env=env)
    assert len(chat.requests) == 5 and not any(r["replayed"] for r in live.rows["model_calls"])
    assert store.sql("SELECT replayed, count(*) FROM model_calls GROUP BY 1 ORDER BY 1").fetchall() == [
        (False, 5), (True, 3)]


def test_replay_model_answers_recorded_requests_in_order_and_refuses_the_rest(store):
    class S(BaseModel):
        asks: list[str] = []

    def ask_twice(s, ctx):
        for _ in range(2):
            s.asks.append(ctx.complete(ctx.env["model"], [{"role": "user", "content": "same question"}]).text)

    flow = Pipeline("twice", S).then(ask_twice).build()
    recorded = flow.run(store=store, env={"model": ScriptedModel(["one", "two"])})
    replayer = ReplayModel(store.run(recorded.run_id))
    again = flow.run(store=store, env={"model": replayer})
    assert again.output.asks == ["one", "two"] and replayer.replayed == 2
    assert [r["replayed"] for r in again.rows["model_calls"]] == [True, True]
    with pytest.raises(ReplayMissError, match="never asked .* no live model was given"):
        replayer.complete([{"role": "user", "content": "same question"}])  # both recorded replies handed out
    fallback = ScriptedModel(default="live answer", name="scripted")
    mixed = ReplayModel(store.run(recorded.run_id), live=fallback)
    assert mixed.complete([{"role": "user", "content": "other"}]).text == "live answer"
    assert mixed.complete([{"role": "user", "content": "same question"}]).text == "one"
    assert (mixed.replayed, mixed.live_calls, len(fallback.calls)) == (1, 1, 1)


class Shape(BaseModel):
    x: int


def test_the_request_hash_covers_every_option_and_is_the_same_in_another_process():
    messages = [{"role": "user", "content": "hi"}]
    base = request_hash("m1", messages, {})
    assert request_hash("m1", messages, {"on_token": print}) == base  # a stream watcher asks nothing different
    assert len({base, request_hash("m2", messages, {}), request_hash("m1", messages, {"temperature": 0}),
                request_hash("m1", messages, {"schema": Shape}), request_hash("m1", messages, {"tools": [len]}),
                request_hash("m1", [{"role": "user", "content": "hi!"}], {})}) == 6
    assert request_hash("m1", messages, {"a": 1, "b": 2}) == request_hash("m1", messages, {"b": 2, "a": 1})
    code = ("from tracemem.flow.replay import request_hash\nfrom pydantic import BaseModel\n"
            "class Shape(BaseModel):\n    x: int\n"
            "print(request_hash('m1', [{'role': 'user', 'content': 'hi'}], {'schema': Shape, 'temperature': 0}))")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                           env={"PYTHONHASHSEED": "7"}).stdout.strip()
    assert other == request_hash("m1", messages, {"schema": Shape, "temperature": 0})
    assert json.loads(json.dumps(other)) == other and len(other) == 32
