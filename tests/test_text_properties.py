"""Property: any text a model, a tool or a user produces is recorded whole, on both backends.

Hypothesis draws arbitrary text (lone surrogates and NUL characters included, and often) and puts it in
every recorded field at once: a log line, the subject, a stage's error, a model's reply, the pipeline's
name, written values (set and appended) and an extra row. Each run must then be in the store once, with
its status, its step, every write, its model call and its row, each value exactly as the store holds such
text (DuckDB: as given, a lone surrogate escaped as `\\udXXX`; PostgreSQL: also each NUL as `\\u0000`),
noted on the run exactly when something was escaped, and loadable again. Durability "run" (the background
writer's batches) and "stage" (the journal, then the batch), on a DuckDB file and a real PostgreSQL server.
"""
from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from pg_fixtures import pg_server, pg_url, store_factory  # noqa: F401
from tracemem import Pipeline
from tracemem.models import ScriptedModel
from tracemem.surrogates import ESCAPED, NUL_ESCAPED

AWKWARD = st.sampled_from(["\x00", "\ud83d", "\ude00", "\udfff", "\\", '"', "\u2028", "😀", "{", "'"])
CHARS = st.text(alphabet=st.one_of(st.characters(exclude_categories=()), AWKWARD), max_size=16)  # surrogates too
LOOKALIKES = st.sampled_from(["", "", "\\u0000", "\\ud83d"])  # text that reads like an escape
TEXT = st.tuples(CHARS, LOOKALIKES, CHARS).map("".join)


class Scope(BaseModel):
    text: str = ""
    items: list[str] = []
    answer: str = ""


def stage_for(text: str, fail: bool) -> Any:
    def stage(s: Scope, ctx: Any) -> None:
        ctx.log(f"log {text}")
        s.text = text
        s.items.append(text)
        s.answer = ctx.complete(ctx.env["model"], [{"role": "user", "content": "hello"}]).text
        ctx.emit("prompts", prompt_id=f"p-{ctx.run_id}", text=text)
        if fail:
            raise RuntimeError(f"failed {text}")
    return stage


def held(text: str, kind: str) -> str:
    """`text` as a store of `kind` holds it."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text.replace("\x00", "\\u0000") if kind == "postgres" else text


def escaped(text: str, kind: str) -> bool:
    return held(text, kind) != text


@pytest.mark.parametrize("durability", ["run", "stage"])
def test_any_text_in_every_recorded_field_is_recorded_whole(store_factory, durability):
    kind = store_factory.kind
    store = store_factory(durability=durability)

    @settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                      HealthCheck.too_slow])
    @given(text=TEXT, name=TEXT, subject=TEXT, reply=TEXT, fail=st.booleans())
    def one_run(text: str, name: str, subject: str, reply: str, fail: bool) -> None:
        flow = Pipeline(f"pipe {name}", Scope).then(stage_for(text, fail), id="stage").build()
        run = flow.run({}, store=store, env={"model": ScriptedModel(default=f"reply {reply}")},
                       subject=f"subj {subject}", raise_on_error=False)
        store.flush()  # nothing is raised: escaping a value loses nothing
        assert run.status == ("failed" if fail else "ok")
        rows = store.sql("SELECT status, pipeline, subject, notes FROM runs WHERE run_id = ?", [run.run_id]).fetchall()
        assert len(rows) == 1
        status, pipeline, subj, notes = rows[0]
        assert (status, pipeline, subj) == (run.status, held(f"pipe {name}", kind), held(f"subj {subject}", kind))
        steps = store.sql("SELECT stage, status, error, logs[1] FROM steps WHERE run_id = ?", [run.run_id]).fetchall()
        assert steps == [("stage", run.status, held(f"RuntimeError: failed {text}", kind) if fail else None,
                          held(f"log {text}", kind))]
        assert store.sql("SELECT count(*) FROM writes WHERE run_id = ?", [run.run_id]).fetchall() == \
            [(len(run.writes),)]
        assert store.sql("SELECT response FROM model_calls WHERE run_id = ?", [run.run_id]).fetchall() == \
            [(held(f"reply {reply}", kind),)]
        assert store.sql("SELECT text FROM prompts WHERE run_id = ?", [run.run_id]).fetchall() == \
            [(held(text, kind),)]
        loaded = store.run(run.run_id)
        assert [w.path for w in loaded.writes] == [w.path for w in run.writes]
        if not fail:
            assert (loaded.output.text, loaded.output.items, loaded.output.answer) == \
                (held(text, kind), [held(text, kind)], held(f"reply {reply}", kind))
        said = " ".join(notes or [])
        everything = [text, name, subject, reply]
        surrogates = any(t.encode("utf-8", "surrogatepass") != t.encode("utf-8", "backslashreplace")
                         for t in everything)
        assert (ESCAPED in said) == surrogates
        assert (NUL_ESCAPED in said) == (kind == "postgres" and any("\x00" in t for t in everything))

    one_run()
