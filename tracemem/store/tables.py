"""The DuckDB schema: versioned, with migrations from every earlier version.

Table and column names are a public contract (users write SQL against them);
add columns or tables in a new version with a migration, never rename.
"""
from __future__ import annotations

from typing import Callable

import duckdb

from ..dbmeta import META_DDL, get_meta, set_meta
from ..errors import StoreError, TracememError
from ..memory.tables import MEMORY_DDL
from .audit.feedback import FEEDBACK_DDL
from .audit.suspect import SUSPECT_VIEW_DDL

SCHEMA_VERSION = 12
FORMAT = "tracemem"

# Version 1: the run record (its first cut).
V1_DDL: list[str] = [
    """CREATE TABLE runs (
        run_id VARCHAR, pipeline VARCHAR, pipeline_hash VARCHAR, status VARCHAR, error VARCHAR,
        started_at TIMESTAMP_NS, ended_at TIMESTAMP_NS, input JSON, output JSON,
        parent_run_id VARCHAR, parent_step INTEGER, pid INTEGER, host VARCHAR)""",
    """CREATE TABLE steps (
        run_id VARCHAR, step INTEGER, stage VARCHAR, name VARCHAR, kind VARCHAR, iteration INTEGER,
        status VARCHAR, error VARCHAR, started_at TIMESTAMP_NS, ended_at TIMESTAMP_NS,
        routed_by INTEGER, child_run_id VARCHAR, logs VARCHAR[])""",
    """CREATE TABLE writes (run_id VARCHAR, step INTEGER, seq INTEGER, path VARCHAR, verb VARCHAR, value JSON)""",
    """CREATE TABLE reads (
        run_id VARCHAR, step INTEGER, seq INTEGER, path VARCHAR, source_step INTEGER, source_seq INTEGER)""",
    """CREATE TABLE decisions (run_id VARCHAR, step INTEGER, chosen VARCHAR, evidence JSON)""",
    """CREATE TABLE model_calls (
        run_id VARCHAR, step INTEGER, call_id VARCHAR, model VARCHAR, provider VARCHAR, prompt_id VARCHAR,
        response VARCHAR, input_tokens INTEGER, output_tokens INTEGER, latency_ms DOUBLE,
        started_at TIMESTAMP_NS, error VARCHAR)""",
    """CREATE TABLE prompts (prompt_id VARCHAR, run_id VARCHAR, step INTEGER, text VARCHAR, messages JSON)""",
    """CREATE TABLE prompt_sections (
        prompt_id VARCHAR, idx INTEGER, kind VARCHAR, text VARCHAR, start_char INTEGER, end_char INTEGER,
        source_kind VARCHAR, source_id VARCHAR, run_id VARCHAR, step INTEGER)""",
    """CREATE TABLE memory_uses (
        run_id VARCHAR, step INTEGER, memory_id VARCHAR, outcome VARCHAR, reason VARCHAR, score DOUBLE,
        rank INTEGER)""",
]

# Version 2: run subjects, queries and trace ids; snapshot uses; run embeddings.
V2_MIGRATION: list[str] = [
    "ALTER TABLE runs ADD COLUMN subject VARCHAR",
    "ALTER TABLE runs ADD COLUMN query VARCHAR",
    "ALTER TABLE runs ADD COLUMN trace_id VARCHAR",
    "ALTER TABLE runs ADD COLUMN continues_run_id VARCHAR",
    """CREATE TABLE snapshot_uses (
        run_id VARCHAR, step INTEGER, source_run_id VARCHAR, score DOUBLE, projection VARCHAR, query VARCHAR)""",
    "CREATE TABLE step_journal (run_id VARCHAR, step INTEGER, kind VARCHAR, payload VARCHAR)",
    """CREATE TABLE run_embeddings (
        run_id VARCHAR, pipeline VARCHAR, embedder_id VARCHAR, query VARCHAR, embedding FLOAT[],
        created_at TIMESTAMP_NS)""",
]

# Version 3: how a subflow step maps the child run's outputs (was a "subflow outputs {json}" log line).
V3_MIGRATION: list[str] = [
    """CREATE TABLE subflows (run_id VARCHAR, step INTEGER, child_run_id VARCHAR, inputs JSON, outputs JSON)""",
    """INSERT INTO subflows SELECT run_id, step, child_run_id, NULL, substr(line, 17)
       FROM (SELECT run_id, step, child_run_id, unnest(logs) AS line FROM steps WHERE kind = 'subflow')
       WHERE starts_with(line, 'subflow outputs ')""",
    """UPDATE steps SET logs = list_filter(logs, lambda l: NOT starts_with(l, 'subflow outputs '))
       WHERE kind = 'subflow'""",
]

# Version 4: durations in milliseconds as columns (DuckDB 2 has no epoch_ms(TIMESTAMP_NS)), computed by the
# writer from the recorded ns timestamps (model calls: their measured latency), and why a run that ended ok
# did less than it should (`ctx.degrade(reason)`; NULL when it did not).
V4_MIGRATION: list[str] = [
    "ALTER TABLE runs ADD COLUMN duration_ms DOUBLE",
    "ALTER TABLE runs ADD COLUMN degraded VARCHAR",
    "UPDATE runs SET duration_ms = (epoch_ns(ended_at) - epoch_ns(started_at)) / 1e6",
    "ALTER TABLE steps ADD COLUMN duration_ms DOUBLE",
    "UPDATE steps SET duration_ms = (epoch_ns(ended_at) - epoch_ns(started_at)) / 1e6",
    "ALTER TABLE model_calls ADD COLUMN duration_ms DOUBLE",
    "UPDATE model_calls SET duration_ms = latency_ms",
]

# Version 5: judgements on recorded values, and the runs they (or flagged memories) make suspect.
V5_MIGRATION: list[str] = [FEEDBACK_DDL, SUSPECT_VIEW_DDL]

# Version 6: pause, resume, fork and replay. A paused run holds its question in `pending` and
# where it continues in `resume_at`; a fork names the run and step it started from; a human's answers are
# rows of their own; each model call keeps the hash of its exact request and whether it was replayed.
V6_MIGRATION: list[str] = [
    "ALTER TABLE runs ADD COLUMN pending JSON",
    "ALTER TABLE runs ADD COLUMN resume_at JSON",
    "ALTER TABLE runs ADD COLUMN forked_from_run_id VARCHAR",
    "ALTER TABLE runs ADD COLUMN forked_from_step INTEGER",
    "ALTER TABLE runs ADD COLUMN span_id VARCHAR",
    "ALTER TABLE model_calls ADD COLUMN request_hash VARCHAR",
    "ALTER TABLE model_calls ADD COLUMN replayed BOOLEAN",
    """CREATE TABLE human_inputs (
        run_id VARCHAR, step INTEGER, idx INTEGER, input_id VARCHAR, payload JSON, answer JSON,
        answered_by VARCHAR, asked_step INTEGER, answered_at TIMESTAMP_NS)""",
]

# Version 7: a counterfactual run says what it tests (the source it leaves out, the run and value it re-asks).
V7_MIGRATION: list[str] = ["ALTER TABLE runs ADD COLUMN counterfactual JSON"]

# Version 8: tool calls. A model call keeps the tool calls its reply asked for; each tool call a
# tool agent ran is a row of its own (its step is the tool step), with its outcome and timing.
V8_MIGRATION: list[str] = [
    "ALTER TABLE model_calls ADD COLUMN tool_calls JSON",
    """CREATE TABLE tool_calls (
        run_id VARCHAR, step INTEGER, call_id VARCHAR, name VARCHAR, arguments JSON, arguments_text VARCHAR,
        result VARCHAR, error VARCHAR, error_kind VARCHAR, truncated BOOLEAN, original_chars INTEGER,
        started_at TIMESTAMP_NS, duration_ms DOUBLE)""",
]

RUN_TABLES = ("runs", "steps", "writes", "reads", "decisions", "model_calls", "prompts", "prompt_sections",
              "memory_uses", "snapshot_uses", "run_embeddings", "step_journal", "subflows", "feedback",
              "human_inputs", "tool_calls", "effects")

# Version 9 (big stores and long threads):
# - runs.thread_id: the first run of the conversation thread a run continues (NULL for a run that continues
#   none), so a thread is one indexed lookup instead of a recursive walk over `runs` (runs recorded before
#   keep NULL: their threads are still walked, see store/read/load.py `chain_of`);
# - ART indexes (INDEXES below) on run_id in the run tables a load reads, and on runs.parent_run_id and
#   runs.thread_id, once the store is big: loading a run is point lookups, not scans (a 1M-run store:
#   ~120 ms → a few ms; ~1 µs/stage more writer CPU);
# - pruned_runs: a tombstone per run `prune(force=True)` removed, so a trace crossing into one says so.
V9_MIGRATION: list[str] = [
    "ALTER TABLE runs ADD COLUMN thread_id VARCHAR",
    "CREATE TABLE pruned_runs (run_id VARCHAR, pruned_at TIMESTAMP_NS)",
]
# Built once a store holds INDEX_FROM runs (at a writable open, or by the writer as the store grows):
# below that a scan costs about what a lookup does, while the indexes' blocks would add a third to a small
# file (a 500-turn chat: 0.79 → 1.08 MB). Never inside a migration's transaction (DuckDB cannot index a
# table with uncommitted updates, which earlier migrations make); a prune drops and rebuilds them.
INDEX_FROM = 20_000
INDEXES: list[str] = [
    *[f"CREATE INDEX IF NOT EXISTS {table}_run_id_idx ON {table} (run_id)"
      for table in RUN_TABLES if table not in ("step_journal", "run_embeddings")],
    "CREATE INDEX IF NOT EXISTS runs_parent_run_id_idx ON runs (parent_run_id)",
    "CREATE INDEX IF NOT EXISTS runs_thread_id_idx ON runs (thread_id)",
    "CREATE INDEX IF NOT EXISTS message_chains_run_id_idx ON message_chains (run_id)",
    "CREATE INDEX IF NOT EXISTS message_chains_chain_id_idx ON message_chains (chain_id)",
    "CREATE INDEX IF NOT EXISTS messages_message_id_idx ON messages (message_id)",
]

# Version 10 (hardening): which store opening recorded a run (crash recovery tells live runs by it, not by
# the PID, which a restarted container reuses), and what tracemem had to change or could not store of it.
V10_MIGRATION: list[str] = [
    "ALTER TABLE runs ADD COLUMN lease VARCHAR",
    "ALTER TABLE runs ADD COLUMN notes VARCHAR[]",
]

# Version 11 (side effects): what kind of run a run is (a run, a fork, a replaying fork, a counterfactual),
# and every side effect a step made (a tool call, an effect stage, `ctx.effect`): run live or replayed from
# the record, with the idempotency key it was given.
RUN_KINDS = ("run", "fork", "replay", "counterfactual")
EFFECTS_DDL = """CREATE TABLE effects (
    run_id VARCHAR, step INTEGER, idx INTEGER, kind VARCHAR, name VARCHAR, input_hash VARCHAR,
    idempotency_key VARCHAR, mode VARCHAR, source_run_id VARCHAR, source_step INTEGER, result JSON,
    error VARCHAR, started_at TIMESTAMP_NS, duration_ms DOUBLE)"""
V11_MIGRATION: list[str] = [
    "ALTER TABLE runs ADD COLUMN kind VARCHAR",
    "UPDATE runs SET kind = CASE WHEN counterfactual IS NOT NULL THEN 'counterfactual' "
    "WHEN forked_from_run_id IS NOT NULL THEN 'fork' ELSE 'run' END",
    EFFECTS_DDL,
]

# Version 12: the exact request of every model call, content-addressed (tracemem/exchange.py): each message once
# (`messages`), each message sequence as links to the one before it (`message_chains`), each set of tool
# definitions once (`tool_sets`); a call names its system instructions' and its input's chains, its tools, its
# other options and its reply. `run_id` on them: the run that recorded the content first.
V12_MIGRATION: list[str] = [
    "ALTER TABLE model_calls ADD COLUMN system_id VARCHAR",
    "ALTER TABLE model_calls ADD COLUMN input_id VARCHAR",
    "ALTER TABLE model_calls ADD COLUMN tools_id VARCHAR",
    "ALTER TABLE model_calls ADD COLUMN options JSON",
    "ALTER TABLE model_calls ADD COLUMN output_id VARCHAR",
    "CREATE TABLE messages (message_id VARCHAR, role VARCHAR, message JSON, run_id VARCHAR)",
    """CREATE TABLE message_chains (
        chain_id VARCHAR, parent_id VARCHAR, message_id VARCHAR, depth INTEGER, run_id VARCHAR)""",
    "CREATE TABLE tool_sets (tools_id VARCHAR, tools JSON, run_id VARCHAR)",
]

MIGRATIONS: dict[int, list[str]] = {2: V2_MIGRATION, 3: V3_MIGRATION, 4: V4_MIGRATION, 5: V5_MIGRATION,
                                    6: V6_MIGRATION, 7: V7_MIGRATION, 8: V8_MIGRATION, 9: V9_MIGRATION,
                                    10: V10_MIGRATION, 11: V11_MIGRATION, 12: V12_MIGRATION}

CONTENT_TABLES = ("messages", "message_chains", "tool_sets")  # keyed by content, shared by runs (not RUN_TABLES)
ALL_TABLES = RUN_TABLES + ("pruned_runs", "memories", "memory_events", "tracemem_meta") + CONTENT_TABLES
VIEWS = ("suspect_runs",)  # derived from the tables, never stored


def create(con: duckdb.DuckDBPyConnection, version: int = SCHEMA_VERSION) -> None:
    """Create a fresh store at `version` (older versions exist for migration tests)."""
    con.execute(META_DDL)
    for ddl in V1_DDL + MEMORY_DDL:
        con.execute(ddl)
    for v in range(2, version + 1):
        for ddl in MIGRATIONS.get(v, ()):
            con.execute(ddl)
    set_meta(con, "format", FORMAT)
    set_meta(con, "schema_version", str(version))


def open_schema(con: duckdb.DuckDBPyConnection, path: str, read_only: bool,
                log: Callable[[str], None] = lambda m: None) -> int:
    """Check the file is a tracemem store, migrate it if older; return its version."""
    tables = {r[0] for r in con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main'").fetchall()}
    if not tables:
        if read_only:
            raise TracememError(f"{path} is empty, not a tracemem store; run a flow with Store('{path}') first")
        create(con)
        return SCHEMA_VERSION
    if "tracemem_meta" not in tables or get_meta(con, "format") != FORMAT:
        shown = ", ".join(sorted(tables)[:8])
        raise TracememError(
            f"{path} is not a tracemem store (it holds tables {shown} but no tracemem_meta format marker); "
            f"point tracemem at another path, e.g. --db agent.duckdb")
    stored = get_meta(con, "schema_version")
    try:
        version = int(stored or 0)
    except ValueError:
        raise StoreError(
            f"{path} has an unreadable schema_version {stored!r} in its tracemem_meta table (a whole number is "
            f"expected), so tracemem cannot tell how to read it; if it was edited, set it back "
            f"(UPDATE tracemem_meta SET value = '<version>' WHERE key = 'schema_version'), else restore a backup"
        ) from None
    if version > SCHEMA_VERSION:
        raise TracememError(
            f"{path} was written by a newer tracemem (schema v{version}; this version reads up to "
            f"v{SCHEMA_VERSION}); upgrade: pip install -U tracemem-agents")
    if version < 1:
        raise TracememError(f"{path} has an unknown tracemem schema version {version!r}; it cannot be opened")
    if version < SCHEMA_VERSION:
        if read_only:
            raise TracememError(
                f"{path} uses schema v{version} and needs migrating to v{SCHEMA_VERSION}; "
                f"open it once without read_only (Store('{path}'), or `tracemem sql \"SELECT 1\" --write --db {path}`)")
        con.execute("BEGIN TRANSACTION")
        try:
            for ddl in MEMORY_DDL:
                con.execute(ddl)
            for v in range(version + 1, SCHEMA_VERSION + 1):
                for ddl in MIGRATIONS.get(v, ()):
                    con.execute(ddl)
                log(f"migrated {path} to schema v{v}")
            set_meta(con, "schema_version", str(SCHEMA_VERSION))
            con.execute("COMMIT")
        except Exception as err:
            con.execute("ROLLBACK")
            raise TracememError(f"migrating {path} from schema v{version} failed: {err}; the file is unchanged") from err
    return SCHEMA_VERSION


def index(con: duckdb.DuckDBPyConnection, log: Callable[[str], None] = lambda m: None,
          at_least: int = INDEX_FROM) -> bool:
    """Build the run tables' indexes once the store holds `at_least` runs (again after a prune that died
    rebuilding them: IF NOT EXISTS); whether the store is indexed. A failure is logged, never raised: the
    store reads correctly without them, only slower."""
    runs = con.execute("SELECT count(*) FROM runs").fetchall()[0][0]
    if runs < at_least:
        return False
    try:
        for ddl in INDEXES:
            con.execute(ddl)
    except duckdb.Error as err:
        log(f"indexing the store failed ({str(err).splitlines()[0]}); it works, only slower")
        return False
    return True
