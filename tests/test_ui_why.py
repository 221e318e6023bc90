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
