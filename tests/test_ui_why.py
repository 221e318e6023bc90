"""The viewer's backtrack page for a tool agent's wrong answer (tests/why_scenario.py): the "why" list first,
then the folded graph — at most 15 nodes before anything is opened, each "+" drawing what lies behind one node,
the full graph one click away. Here through the app in-process; tests/test_ui_why_browser.py in Chromium."""
from __future__ import annotations

import re

import pytest
from starlette.testclient import TestClient

import why_scenario as ws
from tracemem.store import Store
from tracemem.ui import create_app


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("uiwhy") / "agent.duckdb")
    with Store(path) as store:
        scenario = ws.play(store)
    web = TestClient(create_app(path), base_url="http://127.0.0.1")
    return scenario, web, f"/runs/{scenario['wrong'].run_id}/backtrack"


def nodes(html: str) -> list[str]:
    return re.findall(r'<g class="node [^"]*" data-node="([^"]+)"', html)


def test_the_why_list_comes_first_and_names_the_planted_memory_in_its_top_three(page):
    scenario, web, base = page
    html = web.get(base).text
    assert html.index('id="why"') < html.index('id="trace-graph"')
    rows = re.findall(r'<tr class="cause-(\w+)" data-node="([^"]+)"', html)
    assert f"m:{scenario['planted']}" in [node for _, node in rows[:3]]
    planted_row = html[html.index(f'data-node="m:{scenario["planted"]}"'):]
    planted_row = planted_row[:planted_row.index("</tr>")]
    assert f"run {scenario['runs'][1].run_id[:8]}" in planted_row and '<strong class="turn">t2</strong>' in planted_row
    assert "not verified" in html[html.index('id="why-basis"'):][:400]


def test_the_folded_graph_draws_at_most_15_nodes_and_opens_node_by_node(page):
    scenario, web, base = page
    html = web.get(base).text
    drawn = nodes(html)
    full = nodes(web.get(f"{base}?full=1").text)
    assert 3 <= len(drawn) <= 15 < len(full), (len(drawn), len(full))
    assert f"m:{scenario['planted']}" in drawn and any(n.startswith("hi:") for n in drawn)
    svg = html[html.index('<svg class="graph trace-graph why-graph"'):]
    opener = re.search(r'class="expand" href="([^"]+)"', svg[svg.index(f'data-node="m:{scenario["planted"]}"'):])
    opened = web.get(base + opener.group(1).replace("&amp;", "&")).text
    more = nodes(opened)
    assert set(drawn) < set(more)  # what lay behind the memory: the step it was learned in
    step = next(n for n in more if n not in drawn)
    assert step.startswith(f"s:{scenario['runs'][1].run_id}:") and "fold again" in opened
    assert web.get(f"{base}?open=nonsense").status_code == 200  # an unknown node is ignored


def test_the_run_page_is_a_waterfall_of_steps_model_and_tool_calls_with_tokens(page):
    scenario, web, _ = page
    html = web.get(f"/runs/{scenario['wrong'].run_id}").text
    part = html[html.index('id="waterfall"'):html.index('id="steps"')]
    calls = scenario["wrong"].rows["model_calls"]
    total_in, total_out = sum(c["input_tokens"] for c in calls), sum(c["output_tokens"] for c in calls)
    assert f"{len(calls)} model calls, {total_in} → {total_out} tokens" in part
    assert part.count('<tr class="wf-step">') == len(scenario["wrong"].steps) == part.count('class="bar ')
    assert part.count('<tr class="wf-model">') == len(calls) and part.count('<tr class="wf-tool">') == 2
    first = calls[0]
    assert f"↳ model support-model · {first['input_tokens']} → {first['output_tokens']} tokens" in part
    assert "waited" in part and "for support-lead" in part  # the approval: a person's wait, cut out of the scale


def test_a_long_wait_for_a_person_is_a_gap_not_the_scale(tmp_path):
    import time as clock

    from pydantic import BaseModel

    from tracemem import Pipeline, StageContext

    class Ask(BaseModel):
        question: str = ""
        approved: bool = False
        answer: str = ""

    def ask(scope: Ask, ctx: StageContext) -> None:
        scope.approved = bool(ctx.interrupt({"approve": scope.question}, expect=bool))

    def reply(scope: Ask) -> None:
        scope.answer = "done" if scope.approved else "no"

    flow = Pipeline("asks", Ask).then(reply, id="before").then(ask).then(reply).build()
    path = str(tmp_path / "wait.duckdb")
    with Store(path) as store:
        run = flow.run({"question": "ship it?"}, store=store)
        clock.sleep(1.2)  # the person takes their time
        run = flow.resume(run.run_id, True, store=store, by="lead")
    html = TestClient(create_app(path), base_url="http://127.0.0.1").get(f"/runs/{run.run_id}").text
    part = html[html.index('id="waterfall"'):html.index('id="steps"')]
    waited = re.search(r"waited (\d+\.\d+) s for lead", part)
    assert waited and float(waited.group(1)) >= 1.2, part
    bars = [(float(x), float(w)) for x, w in re.findall(r'<rect x="([\d.]+)%" y="2" width="([\d.]+)%"', part)]
    gaps = set(re.findall(r'<rect x="([\d.]+)%" y="0" width="([\d.]+)%" height="14" class="gap"', part))
    assert len(gaps) == 1 and float(next(iter(gaps))[1]) == 4.0
    assert max(x + w for x, w in bars) > 95  # the steps span the scale; the wait did not squeeze them to slivers
