"""`tracemem backtrack` reads cleanly on the demo's file: each node printed once and
referred back by a short id, --focus / --max-lines / --depth, unknown kinds and fields refused, and under
"extracted in" only the turn the memory came from."""
from __future__ import annotations

import io
import re

import pytest

from stages.cli import main
from stages.demo import run_demo
from tracemem import PathError, UsageError
from tracemem.store import Store

TAG = re.compile(r"\[(n\d+)\]")


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> dict:
    path = str(tmp_path_factory.mktemp("demo") / "demo.duckdb")
    run_demo(path, fresh=True, out=io.StringIO())
    with Store(path, read_only=True) as store:
        wrong = store.sql("SELECT run_id FROM runs ORDER BY started_at").fetchall()[2][0]
        memory = store.sql("SELECT memory_id FROM memories WHERE text LIKE '%365 days%'").fetchall()[0][0]
    return {"path": path, "wrong": wrong, "memory": memory}


def backtrack(capsys, demo, *options: str) -> tuple[int, list[str], str]:
    capsys.readouterr()
    code = main(["backtrack", demo["wrong"][:8], "answer", "--db", demo["path"], *options])
    captured = capsys.readouterr()
    return code, captured.out.rstrip("\n").splitlines(), captured.err


def body(line: str) -> str:
    """A trace line without its indentation, arrow and short-id tag."""
    return TAG.sub("", line.strip().lstrip("←⇐↞ ")).strip()


def test_each_node_is_printed_once_and_referred_back_by_a_short_id(capsys, demo):
    code, lines, _ = backtrack(capsys, demo)
    assert code == 0 and not any("see above" in line for line in lines)
    nodes = [body(line) for line in lines if not line.strip().lstrip("←⇐↞ ").startswith(("see [", "… "))]
    assert len(nodes) == len(set(nodes))  # printed once each
    tagged: dict[str, int] = {}
    for i, line in enumerate(lines):
        if line.strip().lstrip("←⇐↞ ").startswith("see ["):
            for ref in TAG.findall(line):
                assert ref in tagged and tagged[ref] < i  # refers back to a node printed above, by its id
        else:
            for ref in TAG.findall(line):
                tagged[ref] = i
    assert any(line.strip().lstrip("←⇐↞ ").startswith("see [n") for line in lines)
    code, only, _ = backtrack(capsys, demo, "--only", "memory")
    assert code == 0 and len(only) <= 20  # was 56 lines, 25 of them "(see above)"
    assert sum(f"memory {demo['memory']}" in line for line in only) == 1


def test_under_extracted_in_only_the_turn_the_memory_came_from(capsys, demo):
    with Store(demo["path"], read_only=True) as store:
        trace = store.backtrack(demo["wrong"], "answer")
        g = trace.graph
        for step in (n for n, d in g.nodes(data=True) if d.get("extracted")):
            below = {(g.nodes[c]["kind"], g.nodes[c].get("path")) for c in g.successors(step)}
            assert below == {("model_call", None), ("input", "question"), ("input", "turn_id")}
    code, lines, _ = backtrack(capsys, demo, "--focus", demo["memory"])
    start = next(i for i, line in enumerate(lines) if "extracted in run" in line)
    under = [body(line) for line in lines[start + 1:]]
    assert under[0].startswith("model call fact-extractor-scripted replied")
    assert under[1].startswith("question = My refund window is 365 days") and under[2].startswith("turn_id = t2")
    assert not any(text.startswith(("answer =", "messages +=")) for text in under)  # not the assistant's reply


def test_focus_takes_a_short_id_a_memory_id_or_a_node_id(capsys, demo):
    _, full, _ = backtrack(capsys, demo)
    memory_line = next(line for line in full if f"memory {demo['memory']}" in line)
    short = TAG.search(memory_line).group(1)
    outputs = []
    for ref in (short, f"[{short}]", demo["memory"], f"m:{demo['memory']}"):
        code, lines, _ = backtrack(capsys, demo, "--focus", ref)
        assert code == 0 and any(f"memory {demo['memory']}" in line for line in lines)
        outputs.append(lines)
    assert all(o == outputs[0] for o in outputs) and len(outputs[0]) < len(full)
    assert "User's laptop" not in "\n".join(outputs[0])  # the other memory's chain is left out
    code, _, err = backtrack(capsys, demo, "--focus", "n9999")
    assert code == 1 and "no node 'n9999' on the trace of answer" in err and "short id" in err


def test_max_lines_cuts_with_a_hint_for_the_command_line(capsys, demo):
    code, lines, _ = backtrack(capsys, demo, "--max-lines", "5")
    assert code == 0 and len(lines) == 6
    assert re.fullmatch(r"… \d+ more nodes not shown; raise --max-lines, or narrow with --only KIND or --focus NODE",
                        lines[-1])
    assert "to_json" not in "\n".join(lines)
    with pytest.raises(SystemExit) as exit_:
        backtrack(capsys, demo, "--max-lines", "0")
    assert exit_.value.code == 2 and "--max-lines: takes a number of at least 1, got 0" in capsys.readouterr().err


def test_depth_stops_below_the_value(capsys, demo):
    code, lines, _ = backtrack(capsys, demo, "--depth", "1")
    assert code == 0 and lines[0].startswith("answer = ")
    assert all(not line.startswith(" ") for line in lines)  # level 1 lines carry no indentation
    assert re.fullmatch(r"… \d+ more nodes deeper than depth 1", lines[-1])


def test_an_unknown_kind_is_refused_listing_the_kinds(capsys, demo):
    for extra in ([], ["--json"], ["--mermaid"]):
        code, lines, err = backtrack(capsys, demo, "--only", "bogus", *extra)
        assert code == 1 and lines == []
        assert "'bogus' is not a kind of trace node; kinds: write, input, decision, step, model_call, tool_call, " \
               "prompt_section, memory, run" in err
    with Store(demo["path"], read_only=True) as store:
        with pytest.raises(UsageError, match="not a kind of trace node"):
            store.backtrack(demo["wrong"], "answer").explain(only="bogus")


def test_a_field_the_scope_does_not_have_is_named_with_the_fields(capsys, demo):
    capsys.readouterr()
    assert main(["backtrack", demo["wrong"][:8], "nosuch", "--db", demo["path"]]) == 1
    err = capsys.readouterr().err
    assert "has no field 'nosuch'; its fields: question, turn_id, messages, user, context, memories" in err
    assert "never written" not in err
    with Store(demo["path"], read_only=True) as store:
        run = store.run(demo["wrong"])
        run.schema = None  # a scope this process does not know: the fields come from the recorded paths
        with pytest.raises(PathError, match=r"has no field 'nosuch'; its fields: question, turn_id, messages"):
            run.backtrack("nosuch")
        assert run.backtrack("user").missing == "never-written"  # a field it has, never written
