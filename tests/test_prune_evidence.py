"""Prune keeps the evidence kept runs depend on.

- every earlier turn of a thread whose later turns it keeps, so the last turn still loads and
  backtracking names the turn a value came from;
- runs cited by memories and by `snapshot_uses` of kept runs, transitively; the list of citing tables
  is one tuple (store/audit/citations.py) that new tables plug into;
- `force=True` prunes anyway and leaves a tombstone: a trace that crosses into such a run says
  "pruned", and replaying a thread that lost its first turns says why it cannot;
- limits that cannot work are refused with one line (API: UsageError; CLI: exit 1).
"""
from __future__ import annotations

import io
import json
from datetime import date, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from stages.cli import main
from tracemem import Pipeline, TracememError, UsageError
from tracemem.store import Store
from tracemem.store.audit import citations, retention


class Chat(BaseModel):
    user: str = ""
    messages: list[str] = []
    reply: str = ""


def respond(s: Chat) -> None:
    s.messages.append(s.user)
    s.reply = f"re {s.user} after {len(s.messages)}"
    s.messages.append(s.reply)


CHAT = Pipeline("prune-chat", Chat).then(respond).build()


class Q(BaseModel):
    question: str = ""
    answer: str = ""


def answer(s: Q, ctx: Any) -> None:
    past = ctx.env.get("snapshot")
    if past:
        ctx.emit("snapshot_uses", source_run_id=past, score=0.9, projection="answer", query=s.question)
    s.answer = f"a: {s.question}"


QA = Pipeline("prune-qa", Q).then(answer).build()


def thread(store: Store, turns: int) -> list[Any]:
    runs, previous = [], None
    for i in range(turns):
        previous = CHAT.run({"user": f"u{i}"}, store=store, resume=previous)
        runs.append(previous)
    return runs


def test_prune_keeps_earlier_turns_of_a_kept_thread(tmp_path):
    with Store(str(tmp_path / "t.duckdb")) as store:
        lone = [QA.run({"question": f"q{i}"}, store=store) for i in range(3)]
        runs = thread(store, 6)
        report = store.prune(keep_last=2)
        assert set(report.runs) == {r.run_id for r in lone}  # the unrelated runs go
        assert set(report.kept_cited) == {r.run_id for r in runs[:4]}  # runs[4:] are the newest two
        assert set(report.kept_why.values()) == {"whose thread continues in kept runs"}
        assert "kept 4 run(s) whose thread continues in kept runs" in str(report)
    with Store(str(tmp_path / "t.duckdb")) as store:
        last = store.run(runs[-1].run_id, scope=Chat)
        assert last.output.messages == runs[-1].output.messages  # loads (was KeyError: 'messages')
        first = last.backtrack("messages[0]")
        assert first.graph.nodes[first.root]["run_id"] == runs[0].run_id  # the turn it came from
        assert CHAT.run({"user": "more"}, store=store, resume=runs[-1].run_id).output.messages[-1] == "re more after 13"


def test_prune_keeps_snapshots_and_memory_sources_transitively(tmp_path):
    with Store(str(tmp_path / "s.duckdb")) as store:
        oldest = QA.run({"question": "seen long ago"}, store=store)
        middle = QA.run({"question": "loaded it"}, store=store, env={"snapshot": oldest.run_id})
        store.memory.remember("ana", "likes tea", source_run_id=middle.run_id, source_step=1)
        noise = [QA.run({"question": f"n{i}"}, store=store) for i in range(3)]
        loader = QA.run({"question": "loads noise 0"}, store=store, env={"snapshot": noise[0].run_id})
        report = store.prune(keep_last=1, dry_run=True)
        assert report.kept_why == dict(sorted({
            middle.run_id: "that memories cite", oldest.run_id: "that kept runs loaded as snapshots",
            noise[0].run_id: "that kept runs loaded as snapshots"}.items()))
        assert set(report.runs) == {noise[1].run_id, noise[2].run_id}
        # a snapshot loaded only by a run that goes too is not evidence any more
        report = store.prune(keep_last=0, dry_run=True)
        assert noise[0].run_id in report.runs and loader.run_id in report.runs
        assert oldest.run_id not in report.runs


def test_force_prunes_evidence_and_traces_say_pruned(tmp_path):
    path = str(tmp_path / "f.duckdb")
    with Store(path) as store:
        runs = thread(store, 4)
        source = QA.run({"question": "remembered"}, store=store)
        memory = store.memory.remember("ana", "likes tea", source_run_id=source.run_id, source_step=1)
        keeper = QA.run({"question": "cites"}, store=store)
        runs.append(CHAT.run({"user": "last"}, store=store, resume=runs[-1]))
        report = store.prune(keep_last=2, force=True)
        assert set(report.forced) == {r.run_id for r in runs[:4]} | {source.run_id}
        assert set(report.runs) == set(report.forced)
        assert "evidence (force=True), marked pruned" in str(report)
        gone = dict(store.sql("SELECT run_id, pruned_at FROM pruned_runs").fetchall())
        assert runs[0].run_id in gone and store.pruned_at(runs[0].run_id) == gone[runs[0].run_id]
        assert store.pruned_at(keeper.run_id) is None
    with Store(path) as store:
        last = store.run(runs[-1].run_id, scope=Chat)
        with pytest.raises(TracememError, match=rf"continues run {runs[-2].run_id}, which was pruned on .*force=True"):
            last.state_at()
        with pytest.raises(TracememError, match="was pruned on"):
            CHAT.run({"user": "again"}, store=store, resume=runs[-1].run_id)
        trace = last.backtrack("messages[0]")
        assert trace.missing == "pruned" and "pruned on" in trace.explain()
        assert trace.graph.nodes[trace.root]["run_id"] == runs[-2].run_id
        history = last.backtrack("reply")  # the history read crosses into the pruned turn: it says so
        assert any("pruned on" in (d.get("missing") or "") for _, d in history.graph.nodes(data=True))
        assert "pruned on" in history.explain()
        assert store.memory.get(memory.memory_id).source_run_id == source.run_id  # memories are never pruned


def test_force_pruned_snapshot_and_memory_source_say_pruned(tmp_path):
    with Store(str(tmp_path / "g.duckdb")) as store:
        snap = QA.run({"question": "the past"}, store=store)
        user = QA.run({"question": "now"}, store=store, env={"snapshot": snap.run_id})
        store.prune(keep_last=1, force=True)
        trace = store.run(user.run_id).backtrack("answer")
        past = trace.sources("run")
        assert len(past) == 1 and "pruned on" in past[0]["missing"]
        assert "pruned on" in trace.explain()


def test_a_new_citing_table_plugs_in(tmp_path, monkeypatch):
    with Store(str(tmp_path / "c.duckdb")) as store:
        judged = QA.run({"question": "judged"}, store=store)
        QA.run({"question": "newest"}, store=store)
        store.sql("CREATE TABLE judgements (run_id VARCHAR, verdict VARCHAR)")
        store.sql("INSERT INTO judgements VALUES (?, 'wrong')", [judged.run_id])
        extra = citations.Citation("judgements", "run_id", None, "that judgements cite")
        missing = citations.Citation("no_such_table", "run_id", None, "never")
        monkeypatch.setattr(retention, "CITATIONS", citations.CITATIONS + (extra, missing))
        report = store.prune(keep_last=1, dry_run=True)
        assert report.runs == [] and report.kept_why == {judged.run_id: "that judgements cite"}


@pytest.mark.parametrize("kwargs, says", [
    ({"keep_last": -1}, "keep_last must be a whole number ≥ 0"),
    ({"keep_last": float("inf")}, "got infinite"),
    ({"keep_last": 2.5}, "got 2.5"),
    ({"keep_last": True}, "got True"),
    ({"older_than": "yesterday"}, "older_than must be a datetime"),
    ({}, "prune needs older_than"),
])
def test_prune_refuses_limits_that_cannot_work(tmp_path, kwargs, says):
    with Store(str(tmp_path / "v.duckdb")) as store:
        QA.run({"question": "x"}, store=store)
        with pytest.raises(UsageError, match=says):
            store.prune(**kwargs)
        assert store.prune(older_than=date.today() - timedelta(days=1)).runs == []  # a date is fine
        assert store.prune(older_than=datetime.utcnow() + timedelta(days=1), keep_last=0).rows["runs"] == 1


def cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out=out), out.getvalue()


@pytest.mark.parametrize("argv", [["--keep-last", "-1"], ["--keep-last", "inf"], ["--keep-last", "1.5"],
                                  ["--older-than", "inf"], ["--older-than=-inf"], ["--older-than", "nan"],
                                  ["--older-than", "-3"], ["--older-than", "1e300"]])
def test_cli_prune_refuses_with_one_line(tmp_path, capsys, argv):
    path = str(tmp_path / "c.duckdb")
    with Store(path) as store:
        QA.run({"question": "x"}, store=store)
    capsys.readouterr()
    code, out = cli("prune", *argv, "--db", path)
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and err.startswith("tracemem: error: ") and "Traceback" not in err


def test_cli_prune_force_and_report(tmp_path):
    path = str(tmp_path / "c.duckdb")
    with Store(path) as store:
        runs = thread(store, 3)
    code, out = cli("prune", "--keep-last", "1", "--db", path, "--json")
    report = json.loads(out)
    assert code == 0 and report["runs"] == [] and set(report["kept_why"]) == {r.run_id for r in runs[:2]}
    code, out = cli("prune", "--keep-last", "1", "--force", "--db", path, "--json")
    report = json.loads(out)
    assert code == 0 and set(report["runs"]) == set(report["forced"]) == {r.run_id for r in runs[:2]}
    code, out = cli("backtrack", runs[-1].run_id, "messages[0]", "--db", path)
    assert code == 0 and "pruned on" in out
