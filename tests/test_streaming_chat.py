"""examples/streaming_chat.py served by uvicorn on 127.0.0.1, read as a browser reads server-sent events:
tokens arrive as they are made, tool calls are announced, every turn is recorded, and a client that
leaves mid-reply stops the run (recorded `interrupted`)."""
from __future__ import annotations

import http.client
import importlib.util
import time
from pathlib import Path

import pytest

from tracemem.store import Store

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def chat():
    spec = importlib.util.spec_from_file_location("streaming_chat", ROOT / "examples" / "streaming_chat.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def served(chat, tmp_path):
    with Store(str(tmp_path / "chat.duckdb")) as store:
        server, thread, port = chat.serve(chat.app(store, chat.TypingModel(delay=0.05)))
        try:
            yield port, store
        finally:
            server.should_exit = True
            thread.join(timeout=10)


def test_the_page_and_a_streamed_turn(chat, served):
    port, store = served
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/")
    page = conn.getresponse()
    assert page.status == 200 and 'src="/chat.js"' in page.read().decode()
    got = chat.read_stream(port, "Where is my order A7?", thread="t1")
    kinds = [event for _, event, _ in got]
    assert kinds[:2] == ["tool", "tool"] and kinds[-1] == "done" and set(kinds[2:-1]) == {"token"}
    assert [(d["status"], d["name"]) for _, e, d in got if e == "tool"] == [("requested", "lookup_order"),
                                                                            ("finished", "lookup_order")]
    tokens = [(at, d["text"]) for at, e, d in got if e == "token"]
    done = got[-1][2]
    assert "".join(t for _, t in tokens) == done["answer"] == "Order A7 has shipped and should arrive on Thursday."
    assert tokens[-1][0] - tokens[0][0] > 0.2  # they came one by one as the model typed, not at the end
    run = store.run(done["run_id"])
    assert run.status == "ok" and run.rows["tool_calls"][0]["name"] == "lookup_order"
    again = chat.read_stream(port, "And B2?", thread="t1")
    second = store.run(again[-1][2]["run_id"])
    assert second.continues == run.run_id and "B2" in second.output.answer
    assert [m.role for m in second.output.messages].count("user") == 2


def test_a_client_that_leaves_mid_reply_stops_the_run(served):
    port, store = served
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/chat?thread=t2&q=Where%20is%20A7%3F", headers={"Accept": "text/event-stream"})
    response = conn.getresponse()
    for raw in response:
        if raw.startswith(b"event: token"):
            break
    conn.sock.close()  # the browser tab closed
    conn.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        rows = store.sql("SELECT status, error FROM runs").fetchall()
        if rows and rows[0][0] != "running":
            break
        time.sleep(0.05)
    assert rows and rows[0][0] == "interrupted" and "stopped before its next step" in rows[0][1]
    steps = store.sql("SELECT stage, status FROM steps ORDER BY step").fetchall()
    assert steps[:3] == [("think", "ok"), ("route", "ok"), ("tools", "ok")] and len(steps) < 6


HOSTILE = '<img src=x id=injected onerror="document.title=\'pwned\'">'


def hostile(messages):
    """A model that asks for a tool named like markup (as a prompt-injected model might), then answers."""
    from tracemem.models import ToolCall

    if not any(m["role"] == "tool" for m in messages):
        return ToolCall(name=HOSTILE, arguments={})
    return "Done <b>bold</b>."


def test_the_page_sends_a_csp_and_its_script_shows_text_as_text(chat, served):
    port, _ = served
    for path in ("/", "/chat.js", "/chat.css"):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", path)
        r = conn.getresponse()
        body = r.read().decode()
        assert r.status == 200 and "script-src 'self'" in r.getheader("Content-Security-Policy"), path
        assert "insertAdjacentHTML" not in body and "innerHTML" not in body and "<script>" not in body, path


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("selenium") is None, reason="selenium is not installed")
def test_a_tool_name_the_model_chose_is_shown_as_text_in_a_real_browser(chat, tmp_path):
    from selenium.webdriver.common.by import By

    from tracemem.models import ScriptedModel
    from uiharness import chromium, missing_browser

    if missing_browser():
        pytest.skip(missing_browser())
    with Store(str(tmp_path / "chat.duckdb")) as store:
        server, thread, port = chat.serve(chat.app(store, ScriptedModel(default=hostile, name="hostile")))
        try:
            with chromium() as browser:
                browser.get(f"http://127.0.0.1:{port}/")
                browser.find_element(By.ID, "q").send_keys("<script>document.title='pwned'</script> hi")
                browser.find_element(By.TAG_NAME, "button").click()
                deadline = time.monotonic() + 30
                while "Done" not in browser.find_element(By.ID, "log").text and time.monotonic() < deadline:
                    time.sleep(0.1)
                log = browser.find_element(By.ID, "log")
                assert HOSTILE in log.text and "<script>document.title='pwned'</script> hi" in log.text
                assert "Done <b>bold</b>." in log.text  # the reply's markup, shown as typed
                assert not browser.find_elements(By.ID, "injected") and not log.find_elements(By.TAG_NAME, "img")
                assert browser.title == "tracemem chat"
        finally:
            server.should_exit = True
            thread.join(timeout=10)
