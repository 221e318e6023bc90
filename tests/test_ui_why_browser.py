"""The backtrack page of a tool agent's wrong answer (tests/why_scenario.py) in a real headless Chromium
against a real `tracemem ui`: at most 15 nodes drawn before anything is opened, the planted memory among the
top three of the "why" list with the turn it was learned in, a "+" that draws more, the full graph one click
away. The page is saved as a screenshot under $TRACEMEM_ARTIFACTS (else the test's tmp directory)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

import why_scenario as ws
from tracemem.store import Store
from uiharness import chromium, missing_browser, serve_ui

REASON = missing_browser()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(REASON is not None, reason=REASON or "")]


def test_the_backtrack_page_of_a_tool_agent_folds_to_the_causes(tmp_path):
    from selenium.webdriver.common.by import By

    folder = Path(os.environ.get("TRACEMEM_ARTIFACTS") or tmp_path)
    path = str(tmp_path / "agent.duckdb")
    with Store(path) as store:
        scenario = ws.play(store)
    wrong = scenario["wrong"].run_id
    with serve_ui(path) as url, chromium(1440, 1100) as browser:
        browser.get(url + f"runs/{wrong}/backtrack")
        graph = browser.find_element(By.CSS_SELECTOR, "svg.why-graph")
        drawn = graph.find_elements(By.CSS_SELECTOR, "g.node")
        assert 3 <= len(drawn) <= 15, len(drawn)
        assert graph.size["width"] <= browser.execute_script("return document.documentElement.clientWidth")
        rows = browser.find_elements(By.CSS_SELECTOR, "#why tr[data-node]")[:3]
        planted = next(r for r in rows if r.get_attribute("data-node") == f"m:{scenario['planted']}")
        assert f"run {scenario['runs'][1].run_id[:8]}, turn t2" in planted.text
        browser.find_element(By.ID, "trace-graph").screenshot(str(folder / "why-graph.png"))
        browser.save_screenshot(str(folder / "why-backtrack.png"))
        node = graph.find_element(By.CSS_SELECTOR, f'g[data-node="m:{scenario["planted"]}"]')
        node.find_element(By.CSS_SELECTOR, "a.expand").click()
        more = browser.find_elements(By.CSS_SELECTOR, "svg.why-graph g.node")
        assert len(more) > len(drawn)
        assert any("turn t2" in g.text for g in more if g.get_attribute("data-node").startswith("s:"))
        browser.find_element(By.ID, "full-graph").click()
        full = browser.find_elements(By.CSS_SELECTOR, "svg.trace-graph g.node")
        assert len(full) > 15 and browser.find_element(By.ID, "folded-graph")
        browser.get(url + f"runs/{wrong}")  # the run page: its stage graph fits the page, no sideways scrolling
        width = browser.execute_script("return document.documentElement.clientWidth")
        assert browser.find_element(By.CSS_SELECTOR, "svg.stage-graph").size["width"] <= width
        assert browser.find_elements(By.CSS_SELECTOR, "table.waterfall tr.wf-model")
        assert "for support-lead" in browser.find_element(By.CSS_SELECTOR, "p.wait").text
        browser.save_screenshot(str(folder / "why-run.png"))
