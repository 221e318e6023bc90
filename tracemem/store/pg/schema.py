"""The PostgreSQL schema: the same tables and columns as the DuckDB file, versioned the same way.

Every DuckDB schema version (store/tables.py) has its PostgreSQL statements here under the
same number, so a database is created at `SCHEMA_VERSION` and an older one migrates version
by version, exactly as a file does (a test checks that no version is missing). Types map
one to one: VARCHAR → text, DOUBLE → double precision, TIMESTAMP_NS → timestamp (PostgreSQL
keeps microseconds), JSON → json (kept as written), FLOAT[] → real[], and the memory
embedding is a pgvector `vector` when the server has the extension, else real[].

PostgreSQL adds what many writers need: `step_journal.lease` names the store opening that
wrote a row (crash recovery, pg/lease.py; `runs.lease` too, here from the start), and
`run_embeddings.seq` orders rows as they commit (other processes follow new snapshots by it),
and indexes for lookups by run.

A few DuckDB functions that tracemem's shared SQL and the README recipes use are created in
the store's schema (`COMPAT`), so one query text runs on both. Setting up a schema also sets up
the role read-only SQL runs as (pg/reader.py).
"""
from __future__ import annotations

import re
from typing import Any, Callable, Optional

from ...errors import TracememError
from ..audit.suspect import SUSPECT_VIEW_DDL
from ..tables import FORMAT, SCHEMA_VERSION
from .connection import PgConnection, first_line, quote_ident
from .reader import grant_reader

__all__ = ["PG_MIGRATIONS", "open_pg_schema", "create_pg", "set_pg_meta", "embedding_type", "SCHEMA_LOCK"]

SCHEMA_LOCK = 0x7472  # advisory-lock class for "creating or migrating this schema" (second key: the schema)

COMPAT: list[str] = [
    """CREATE OR REPLACE FUNCTION epoch_ns(t timestamp) RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE
       AS $$ SELECT (extract(epoch FROM t) * 1000000000)::bigint $$""",
    """CREATE OR REPLACE FUNCTION epoch_ns(i interval) RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE
       AS $$ SELECT (extract(epoch FROM i) * 1000000000)::bigint $$""",
    """CREATE OR REPLACE FUNCTION epoch_us(t timestamp) RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE
       AS $$ SELECT (extract(epoch FROM t) * 1000000)::bigint $$""",
    """CREATE OR REPLACE FUNCTION epoch_us(i interval) RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE
       AS $$ SELECT (extract(epoch FROM i) * 1000000)::bigint $$""",
    """CREATE OR REPLACE FUNCTION epoch_ms(t timestamp) RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE
       AS $$ SELECT (extract(epoch FROM t) * 1000)::bigint $$""",
    """CREATE OR REPLACE FUNCTION epoch_ms(i interval) RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE
       AS $$ SELECT (extract(epoch FROM i) * 1000)::bigint $$""",
    """CREATE OR REPLACE FUNCTION make_timestamp_ns(ns bigint) RETURNS timestamp LANGUAGE sql IMMUTABLE
       PARALLEL SAFE AS $$ SELECT to_timestamp(ns / 1e9::double precision) AT TIME ZONE 'UTC' $$""",
    """CREATE OR REPLACE FUNCTION round(x double precision, digits integer) RETURNS double precision
       LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT round(x::numeric, digits)::double precision $$""",
    # the row hash memory/fingerprint.py XORs per subject (DuckDB's hash() of these columns; any 64-bit hash
    # will do, as fingerprints are only ever compared within one store)
    """CREATE OR REPLACE FUNCTION hash(memory_id text, subject text, text text, confidence double precision,
           review_state text, valid_from timestamp, valid_until timestamp, deleted_at timestamp, embedder_id text,
           created_at timestamp, updated_at timestamp) RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE
       AS $$ SELECT hashtextextended(row(memory_id, subject, text, confidence, review_state, valid_from,
           valid_until, deleted_at, embedder_id, created_at, updated_at)::text, 0) $$""",
    """CREATE OR REPLACE FUNCTION list_contains(l anycompatiblearray, x anycompatible) RETURNS boolean
       LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT x = ANY(l) $$""",
    """CREATE OR REPLACE FUNCTION json_keys(j json) RETURNS text[] LANGUAGE sql IMMUTABLE PARALLEL SAFE
       AS $$ SELECT CASE WHEN json_typeof(j) = 'object' THEN ARRAY(SELECT json_object_keys(j)) END $$""",
    """CREATE OR REPLACE FUNCTION json_extract_string(j json, path text) RETURNS text LANGUAGE sql IMMUTABLE
       PARALLEL SAFE AS $$ SELECT j #>> CASE WHEN left(path, 1) = '$'
           THEN string_to_array(nullif(regexp_replace(path, '^\\$\\.?', ''), ''), '.') ELSE ARRAY[path] END $$""",
]

V1: list[str] = [
    """CREATE TABLE runs (
        run_id text, pipeline text, pipeline_hash text, status text, error text,
        started_at timestamp, ended_at timestamp, input json, output json,
        parent_run_id text, parent_step integer, pid integer, host text)""",
    """CREATE TABLE steps (
        run_id text, step integer, stage text, name text, kind text, iteration integer,
        status text, error text, started_at timestamp, ended_at timestamp,
        routed_by integer, child_run_id text, logs text[])""",
    "CREATE TABLE writes (run_id text, step integer, seq integer, path text, verb text, value json)",
    "CREATE TABLE reads (run_id text, step integer, seq integer, path text, source_step integer, source_seq integer)",
    "CREATE TABLE decisions (run_id text, step integer, chosen text, evidence json)",
    """CREATE TABLE model_calls (
        run_id text, step integer, call_id text, model text, provider text, prompt_id text,
        response text, input_tokens integer, output_tokens integer, latency_ms double precision,
        started_at timestamp, error text)""",
    "CREATE TABLE prompts (prompt_id text, run_id text, step integer, text text, messages json)",
    """CREATE TABLE prompt_sections (
        prompt_id text, idx integer, kind text, text text, start_char integer, end_char integer,
        source_kind text, source_id text, run_id text, step integer)""",
    """CREATE TABLE memory_uses (
        run_id text, step integer, memory_id text, outcome text, reason text, score double precision,
        rank integer)""",
    # PostgreSQL only: which store opening wrote the run (crash recovery without PIDs)
    "ALTER TABLE runs ADD COLUMN lease text",
    "CREATE INDEX runs_run_id ON runs (run_id)",
    "CREATE INDEX runs_parent ON runs (parent_run_id)",
    "CREATE INDEX runs_started ON runs (started_at)",
    "CREATE INDEX runs_running ON runs (lease) WHERE status = 'running'",
    "CREATE INDEX steps_run ON steps (run_id, step)",
    "CREATE INDEX writes_run ON writes (run_id, step, seq)",
    "CREATE INDEX reads_run ON reads (run_id, step, seq)",
    "CREATE INDEX decisions_run ON decisions (run_id)",
    "CREATE INDEX model_calls_run ON model_calls (run_id)",
    "CREATE INDEX prompts_run ON prompts (run_id)",
    "CREATE INDEX prompt_sections_prompt ON prompt_sections (prompt_id)",
    "CREATE INDEX memory_uses_run ON memory_uses (run_id)",
    "CREATE INDEX memory_uses_memory ON memory_uses (memory_id)",
]

V2: list[str] = [
    "ALTER TABLE runs ADD COLUMN subject text",
    "ALTER TABLE runs ADD COLUMN query text",
    "ALTER TABLE runs ADD COLUMN trace_id text",
    "ALTER TABLE runs ADD COLUMN continues_run_id text",
    """CREATE TABLE snapshot_uses (
        run_id text, step integer, source_run_id text, score double precision, projection text, query text)""",
    "CREATE TABLE step_journal (run_id text, step integer, kind text, payload text, lease text)",
    """CREATE TABLE run_embeddings (
        run_id text, pipeline text, embedder_id text, query text, embedding real[], created_at timestamp)""",
    "CREATE SEQUENCE run_embedding_seq",
    "ALTER TABLE run_embeddings ADD COLUMN seq bigint DEFAULT nextval('run_embedding_seq')",
    "CREATE INDEX runs_continues ON runs (continues_run_id)",
    "CREATE INDEX snapshot_uses_run ON snapshot_uses (run_id)",
    "CREATE INDEX snapshot_uses_source ON snapshot_uses (source_run_id)",
    "CREATE INDEX step_journal_run ON step_journal (run_id, step)",
    "CREATE INDEX step_journal_lease ON step_journal (lease)",
    "CREATE INDEX run_embeddings_feed ON run_embeddings (pipeline, embedder_id, seq)",
]

V3: list[str] = [
    "CREATE TABLE subflows (run_id text, step integer, child_run_id text, inputs json, outputs json)",
    """INSERT INTO subflows SELECT run_id, step, child_run_id, NULL, substr(line, 17)::json
       FROM (SELECT run_id, step, child_run_id, unnest(logs) AS line FROM steps WHERE kind = 'subflow') s
       WHERE starts_with(line, 'subflow outputs ')""",
    """UPDATE steps SET logs = ARRAY(SELECT l FROM unnest(logs) l WHERE NOT starts_with(l, 'subflow outputs '))
       WHERE kind = 'subflow'""",
    "CREATE INDEX subflows_run ON subflows (run_id)",
]

# DuckDB's view with its one DuckDB-only aggregate spelled the PostgreSQL way (kept in step by a test).
PG_SUSPECT_VIEW = re.sub(r"arg_min\((\w+), (\w+)\)", r"(array_agg(\1 ORDER BY \2))[1]", SUSPECT_VIEW_DDL)

V4: list[str] = [
    "ALTER TABLE runs ADD COLUMN duration_ms double precision",
    "ALTER TABLE runs ADD COLUMN degraded text",
    "UPDATE runs SET duration_ms = (epoch_ns(ended_at) - epoch_ns(started_at)) / 1e6",
    "ALTER TABLE steps ADD COLUMN duration_ms double precision",
    "UPDATE steps SET duration_ms = (epoch_ns(ended_at) - epoch_ns(started_at)) / 1e6",
    "ALTER TABLE model_calls ADD COLUMN duration_ms double precision",
    "UPDATE model_calls SET duration_ms = latency_ms",
]

V5: list[str] = [
    """CREATE TABLE feedback (
        feedback_id text, run_id text, path text, verdict text, score double precision, note text,
        "by" text, "at" timestamp)""",
    "CREATE INDEX feedback_run ON feedback (run_id)",
    PG_SUSPECT_VIEW,
]

V6: list[str] = [
    "ALTER TABLE runs ADD COLUMN pending json",
    "ALTER TABLE runs ADD COLUMN resume_at json",
    "ALTER TABLE runs ADD COLUMN forked_from_run_id text",
    "ALTER TABLE runs ADD COLUMN forked_from_step integer",
    "ALTER TABLE runs ADD COLUMN span_id text",
    "ALTER TABLE model_calls ADD COLUMN request_hash text",
    "ALTER TABLE model_calls ADD COLUMN replayed boolean",
    """CREATE TABLE human_inputs (
        run_id text, step integer, idx integer, input_id text, payload json, answer json,
        answered_by text, asked_step integer, answered_at timestamp)""",
    "CREATE INDEX human_inputs_run ON human_inputs (run_id)",
]

V7: list[str] = ["ALTER TABLE runs ADD COLUMN counterfactual json"]

V8: list[str] = [
    "ALTER TABLE model_calls ADD COLUMN tool_calls json",
    """CREATE TABLE tool_calls (
        run_id text, step integer, call_id text, name text, arguments json, arguments_text text,
        result text, error text, error_kind text, truncated boolean, original_chars integer,
        started_at timestamp, duration_ms double precision)""",
    "CREATE INDEX tool_calls_run ON tool_calls (run_id)",
]

V9: list[str] = [
    "ALTER TABLE runs ADD COLUMN thread_id text",
    "CREATE TABLE pruned_runs (run_id text, pruned_at timestamp)",
    "CREATE INDEX runs_thread_id ON runs (thread_id)",
    "CREATE INDEX pruned_runs_run ON pruned_runs (run_id)",
]

# (store/tables.py's INDEXES, built there once a file is big, exist here from the start: V1 and the tables')
# runs.lease is PostgreSQL's from its first version (V1); the file gains it here
V10: list[str] = ["ALTER TABLE runs ADD COLUMN IF NOT EXISTS lease text", "ALTER TABLE runs ADD COLUMN notes text[]"]

V11: list[str] = [
    "ALTER TABLE runs ADD COLUMN kind text",
    "UPDATE runs SET kind = CASE WHEN counterfactual IS NOT NULL THEN 'counterfactual' "
    "WHEN forked_from_run_id IS NOT NULL THEN 'fork' ELSE 'run' END",
    """CREATE TABLE effects (
        run_id text, step integer, idx integer, kind text, name text, input_hash text, idempotency_key text,
        mode text, source_run_id text, source_step integer, result json, error text, started_at timestamp,
        duration_ms double precision)""",
    "CREATE INDEX effects_run ON effects (run_id)",
]

# content-addressed: unique keys, so that writers on many machines insert each piece once (ON CONFLICT DO NOTHING)
V12: list[str] = [
    "ALTER TABLE model_calls ADD COLUMN system_id text",
    "ALTER TABLE model_calls ADD COLUMN input_id text",
    "ALTER TABLE model_calls ADD COLUMN tools_id text",
    "ALTER TABLE model_calls ADD COLUMN options json",
    "ALTER TABLE model_calls ADD COLUMN output_id text",
    "CREATE TABLE messages (message_id text, role text, message json, run_id text)",
    "CREATE TABLE message_chains (chain_id text, parent_id text, message_id text, depth integer, run_id text)",
    "CREATE TABLE tool_sets (tools_id text, tools json, run_id text)",
    "CREATE UNIQUE INDEX messages_key ON messages (message_id)",
    "CREATE UNIQUE INDEX message_chains_key ON message_chains (chain_id)",
    "CREATE INDEX message_chains_run ON message_chains (run_id)",
    "CREATE UNIQUE INDEX tool_sets_key ON tool_sets (tools_id)",
]

PG_MIGRATIONS: dict[int, list[str]] = {2: V2, 3: V3, 4: V4, 5: V5, 6: V6, 7: V7, 8: V8, 9: V9, 10: V10, 11: V11, 12: V12}


def memory_ddl(vector: str) -> list[str]:
    """The memory tables (memory/tables.py), with `vector` as the embedding's type."""
    return [
        f"""CREATE TABLE IF NOT EXISTS memories (
            memory_id text PRIMARY KEY, subject text NOT NULL, text text NOT NULL,
            tags text[] NOT NULL DEFAULT '{{}}',
            confidence double precision NOT NULL CHECK (confidence >= 0 AND confidence <= 100),
            review_state text NOT NULL CHECK (review_state IN ('fresh', 'reviewed', 'stale', 'contradicted')),
            valid_from timestamp, valid_until timestamp, source_run_id text, source_step integer,
            source_ref text, embedder_id text, embedding {vector}, created_at timestamp NOT NULL,
            updated_at timestamp NOT NULL, deleted_at timestamp, superseded_by text)""",
        "CREATE SEQUENCE IF NOT EXISTS memory_event_seq START 1",
        """CREATE TABLE IF NOT EXISTS memory_events (
            event_id bigint PRIMARY KEY DEFAULT nextval('memory_event_seq'), memory_id text NOT NULL,
            event text NOT NULL, old text, new text, run_id text, "at" timestamp NOT NULL, reason text)""",
        "CREATE INDEX IF NOT EXISTS memory_events_memory_idx ON memory_events (memory_id)",
        "CREATE INDEX IF NOT EXISTS memories_subject ON memories (subject)",
        "CREATE INDEX IF NOT EXISTS memories_source_run ON memories (source_run_id)",
    ]


def set_pg_meta(con: PgConnection, key: str, value: str, *, keep: bool = False) -> None:
    """Set a `tracemem_meta` value (`keep`: only if unset, so concurrent openers agree on the first)."""
    action = "NOTHING" if keep else "UPDATE SET value = excluded.value"
    con.execute(f"INSERT INTO tracemem_meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO {action}", [key, value])


def _get_meta(con: PgConnection, key: str) -> Any:
    row = con.execute("SELECT value FROM tracemem_meta WHERE key = ?", [key]).fetchone()
    return row[0] if row else None


def _vector_type(con: PgConnection) -> Optional[str]:
    """pgvector's `vector` type, qualified by the schema it lives in, installing the extension if the
    server has it and this role may; None when it cannot be had (plain arrays instead)."""
    find = ("SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace "
            "WHERE e.extname = 'vector'")
    row = con.execute(find).fetchone()
    if row is None:
        if not con.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'").fetchone():
            return None
        try:
            con.execute("SAVEPOINT tracemem_vector")
            con.execute("CREATE EXTENSION IF NOT EXISTS vector SCHEMA public")
            con.execute("RELEASE SAVEPOINT tracemem_vector")
        except Exception:  # noqa: BLE001 - no privilege to install it: plain arrays instead
            con.execute("ROLLBACK TO SAVEPOINT tracemem_vector")
            return None
        row = con.execute(find).fetchone()
    return f"{quote_ident(row[0])}.vector"


def create_pg(con: PgConnection, version: int = SCHEMA_VERSION, vector: bool = True) -> None:
    """Create a fresh store at `version` in the connection's schema (inside the caller's transaction)."""
    con.execute("CREATE TABLE tracemem_meta (key text PRIMARY KEY, value text)")
    vector_type = _vector_type(con) if vector else None
    for ddl in COMPAT + V1 + memory_ddl(vector_type or "real[]"):
        con.execute(ddl)
    for v in range(2, version + 1):
        for ddl in PG_MIGRATIONS.get(v, ()):
            con.execute(ddl)
    set_pg_meta(con, "format", FORMAT)
    set_pg_meta(con, "schema_version", str(version))


def embedding_type(con: PgConnection) -> str:
    """'vector' or 'array': how this store keeps memory embeddings."""
    row = con.execute("SELECT udt_name FROM information_schema.columns WHERE table_schema = current_schema() "
                      "AND table_name = 'memories' AND column_name = 'embedding'").fetchone()
    return "vector" if row and row[0] == "vector" else "array"


def open_pg_schema(con: PgConnection, label: str, read_only: bool, log: Callable[[str], None],
                   vector: bool = True) -> int:
    """Check the schema holds a tracemem store, create or migrate it; one process at a time does this."""
    schema = con.target.schema
    if read_only:
        return _check(con, label, schema, read_only=True, log=log)
    con.execute("SELECT pg_advisory_lock(?, hashtext(?))", [SCHEMA_LOCK, schema])
    try:
        with con.transaction():
            if con.execute("SELECT 1 FROM pg_namespace WHERE nspname = ?", [schema]).fetchone() is None:
                con.execute(f'CREATE SCHEMA "{schema}"')  # (only then: it needs CREATE on the database)
            if not _tables(con):
                create_pg(con, vector=vector)
                log(f"created a tracemem store in {label}")
                version = SCHEMA_VERSION
            else:
                version = _check(con, label, schema, read_only=False, log=log)
        grant_reader(con, log)  # the role read-only SQL runs as (store/pg/reader.py), under the same lock
        return version
    finally:
        con.execute("SELECT pg_advisory_unlock(?, hashtext(?))", [SCHEMA_LOCK, schema])


def _tables(con: PgConnection) -> set[str]:
    return {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables "
                                      "WHERE table_schema = current_schema()").fetchall()}


def _check(con: PgConnection, label: str, schema: str, read_only: bool, log: Callable[[str], None]) -> int:
    tables = _tables(con)
    if not tables:
        raise TracememError(f"{label} holds no tracemem store (schema {schema!r} has no tables); "
                            f"run a flow with Store('{label}') first")
    if "tracemem_meta" not in tables or _get_meta(con, "format") != FORMAT:
        raise TracememError(f"{label} is not a tracemem store (schema {schema!r} holds tables "
                            f"{', '.join(sorted(tables)[:8])} but no tracemem_meta format marker); "
                            f"use another database or add ?schema=tracemem to the URL")
    stored = _get_meta(con, "schema_version")
    try:
        version = int(stored or 0)
    except ValueError:
        raise TracememError(f"{label} has an unreadable schema_version {stored!r} in tracemem_meta") from None
    if version > SCHEMA_VERSION:
        raise TracememError(f"{label} was written by a newer tracemem (schema v{version}; this version reads up "
                            f"to v{SCHEMA_VERSION}); upgrade: pip install -U tracemem-agents")
    if version < 1:
        raise TracememError(f"{label} has an unknown tracemem schema version {version!r}; it cannot be opened")
    if version < SCHEMA_VERSION:
        if read_only:
            raise TracememError(f"{label} uses schema v{version} and needs migrating to v{SCHEMA_VERSION}; "
                                f"open it once without read_only")
        try:
            for v in range(version + 1, SCHEMA_VERSION + 1):
                for ddl in PG_MIGRATIONS.get(v, ()):
                    con.execute(ddl)
                log(f"migrated {label} to schema v{v}")
            set_pg_meta(con, "schema_version", str(SCHEMA_VERSION))
        except Exception as err:
            raise TracememError(f"migrating {label} from schema v{version} failed: {first_line(err)}; "
                                f"the database is unchanged") from err
    if not read_only:  # the DuckDB-named functions as this version defines them (CREATE OR REPLACE: cheap)
        for ddl in COMPAT:
            con.execute(ddl)
    return SCHEMA_VERSION
