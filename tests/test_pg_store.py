"""What only the PostgreSQL backend has: migrations of an older database, errors that say what to do,
embeddings as plain arrays where pgvector is missing, SQL translation, snapshots and memory seen by
another opening."""
from __future__ import annotations

import time

import numpy as np
import pytest
from pydantic import BaseModel

from pg_fixtures import pg_server, pg_url  # noqa: F401
from tracemem import Pipeline, TracememError
from tracemem.store import SCHEMA_VERSION, Store
from tracemem.store.pg.connection import PgConnection, parse_target, translate
from tracemem.store.pg.schema import create_pg


class Q(BaseModel):
    question: str = ""
    answer: str = ""


def answer(q):
    q.answer = q.question.upper()


FLOW = Pipeline("qa", Q, query="question").then(answer).build()


def test_translate_rewrites_parameters_outside_quotes_only():
    assert translate("SELECT * FROM t WHERE a = ? AND b LIKE 'x%?' AND \"c?\" = ?") == \
           "SELECT * FROM t WHERE a = %s AND b LIKE 'x%%?' AND \"c?\" = %s"
    assert translate("SELECT '?''?' -- ? here\n, ?") == "SELECT '?''?' -- ? here\n, %s"


def test_the_url_names_a_schema_and_messages_never_show_a_password():
    target = parse_target("postgresql://ana:s3cret@db.example:5433/agents?schema=team_a&sslmode=require")
    assert target.schema == "team_a" and "s3cret" not in target.label and "sslmode=require" in target.conninfo
    assert target.label == "postgresql://ana@db.example:5433/agents?schema=team_a"
    with pytest.raises(TracememError, match="not a plain SQL name"):
        parse_target("postgresql://h/db?schema=a;drop")


def test_an_older_database_is_migrated_and_keeps_its_rows(pg_url):
    con = PgConnection(parse_target(pg_url), "test")
    con.execute(f'CREATE SCHEMA "{con.target.schema}"')
    with con.transaction():
        create_pg(con, version=3)
        con.execute("INSERT INTO runs (run_id, pipeline, status, started_at, ended_at, input) VALUES "
                    "('r1', 'old', 'ok', '2026-01-01 00:00:00', '2026-01-01 00:00:01.5', '{}')")
    con.close()
    logged: list[str] = []
    with Store(pg_url, log=logged.append) as store:
        assert [m for m in logged if "migrated" in m][-1].endswith(f"schema v{SCHEMA_VERSION}")
        assert store.sql("SELECT duration_ms FROM runs WHERE run_id = 'r1'").fetchall() == [(1500.0,)]
        assert "feedback" in store.tables() and "suspect_runs" in store.tables()
        FLOW.run({"question": "still works"}, store=store)
        assert len(store.runs()) == 2


def test_errors_say_what_to_do(pg_url, pg_server):
    with pytest.raises(TracememError, match="cannot connect to postgresql://postgres@127.0.0.1:1/"):
        Store("postgresql://postgres@127.0.0.1:1/nowhere")
    with pytest.raises(TracememError, match="holds no tracemem store"):
        Store(pg_url, read_only=True)
    con = PgConnection(parse_target(pg_url), "test")
    con.execute(f'CREATE SCHEMA "{con.target.schema}"')
    con.execute("CREATE TABLE orders (id int)")
    con.close()
    with pytest.raises(TracememError, match="is not a tracemem store .* orders"):
        Store(pg_url)


def test_memory_without_pgvector_keeps_embeddings_as_arrays(pg_url):
    con = PgConnection(parse_target(pg_url), "test")
    con.execute(f'CREATE SCHEMA "{con.target.schema}"')
    with con.transaction():
        create_pg(con, vector=False)
    con.close()
    with Store(pg_url) as store:
        assert store.memory.sql.kind == "array"
        tea = store.memory.remember("ana", "Ana drinks green tea", confidence=90)
        assert store.sql("SELECT pg_typeof(embedding)::text FROM memories").fetchall() == [("real[]",)]
        stored = store.memory.embedding(tea.memory_id)
        assert np.allclose(stored, store.memory.embedder.embed(["Ana drinks green tea"])[0], atol=1e-6)
    with Store(pg_url) as again:  # a new process's index, loaded from the arrays
        assert [r.memory_id for r in again.memory.search("ana", "green tea", recall=True).records] == [tea.memory_id]
        assert again.memory.reembed(again.memory.embedder) == 1


def test_with_pgvector_embeddings_are_vectors_and_similarity_runs_in_sql_too(pg_url):
    with Store(pg_url) as store:
        if store.memory.sql.kind != "vector":
            pytest.skip("this server has no pgvector")
        tea = store.memory.remember("ana", "Ana drinks green tea", confidence=90)
        store.memory.remember("ana", "Ana owns a bicycle", confidence=90)
        query = store.memory.embedder.embed(["green tea"])[0]
        literal = "[" + ",".join(f"{v:.7g}" for v in query) + "]"
        nearest = store.sql(f"SELECT memory_id FROM memories ORDER BY embedding <=> '{literal}' LIMIT 1").fetchall()
        assert nearest == [(tea.memory_id,)]


def test_a_run_recorded_by_one_opening_is_a_snapshot_for_another(pg_url):
    with Store(pg_url) as a, Store(pg_url) as b:
        assert b.similar_runs("qa", "how do I reset my password") == []  # b's index exists, then goes stale
        past = FLOW.run({"question": "how do I reset my password"}, store=a)
        a.flush()
        hits = b.similar_runs("qa", "how do I reset my password")
        assert hits and hits[0][0] == past.run_id and hits[0][2] > 0.99
        assert b.run(past.run_id).output.answer == "HOW DO I RESET MY PASSWORD"


def test_two_openings_write_at_once_and_neither_recovers_the_other(pg_url):
    with Store(pg_url, durability="stage", lease_seconds=0.4) as a, \
            Store(pg_url, durability="stage", lease_seconds=0.4) as b:
        ids = [FLOW.run({"question": f"q{i}"}, store=(a if i % 2 else b)).run_id for i in range(40)]
        time.sleep(0.5)  # both reapers ran: each lease is held, nothing is touched
        a.flush()
        b.flush()
        statuses = dict(a.sql("SELECT run_id, status FROM runs").fetchall())
        assert {statuses[i] for i in ids} == {"ok"} and a.backend.reaper.found == b.backend.reaper.found == []
