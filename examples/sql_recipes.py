"""SQL recipes over a tracemem store: the run history is plain DuckDB tables.

The example fills an in-memory store with a support agent's runs (recall →
lookup → assemble_prompt → call_model, for three customers; one run fails at
the model), then flags one memory as wrong after the fact, asks once more, and answers,
with one SQL query each:

1. Which stages are slowest?
2. In which runs was a given memory injected into the prompt?
3. Which answers were given with a memory that has since been flagged?
4. What did each model cost in tokens, and how often did it fail?
5. Why did recall leave memories out?

The same queries work on a file: `tracemem sql "..." --db agent.duckdb`.

    python examples/sql_recipes.py
"""
from __future__ import annotations

import time

from stages import AgentScope, assemble_prompt, call_model, recall
from tracemem import Pipeline
from tracemem.models import ScriptedModel
from tracemem.store import Store

MEMORIES = {
    "cust-1": [("User's plan is Pro", 90), ("User's refund window is 90 days", 75)],
    "cust-2": [("User's plan is Basic", 90), ("User's plan might be Team", 40)],
    "cust-3": [("User's refund window is 14 days", 80)],
}
QUESTIONS = {
    "cust-1": ["Which plan am I on?", "How long is my refund window?", "Can I get a refund after 60 days?"],
    "cust-2": ["Which plan am I on?", "Can I upgrade my plan?"],
    "cust-3": ["How long is my refund window?", "Please explain my refund window"],
}


def lookup_order(scope: AgentScope) -> None:
    """Stands in for a slow backend call."""
    time.sleep(0.01)
    scope.context = {"orders": 2, "last_order_days_ago": 60}


def reply(messages: list[dict[str, str]]) -> str:
    question = messages[-1]["content"]
    if question.startswith("Please"):
        raise TimeoutError("model gateway timed out")
    lines = [line.split('"')[1] for line in messages[0]["content"].splitlines() if line.startswith('  - "')]
    return f"Based on what I know ({'; '.join(lines) or 'nothing'}): here is my answer."


def fill(store: Store) -> None:
    for subject, facts in MEMORIES.items():
        for text, confidence in facts:
            store.memory.remember(subject, text, confidence=confidence)
    flow = (Pipeline("support", AgentScope, query="question")
            .then(recall()).then(lookup_order).then(assemble_prompt()).then(call_model("model")).build())
    model = ScriptedModel(default=reply, name="support-scripted")
    for subject, questions in QUESTIONS.items():
        for question in questions:
            flow.run({"question": question}, store=store, subject=subject, env={"model": model},
                     raise_on_error=False)
    wrong = store.memory.records("cust-1")[1]  # "refund window is 90 days": the policy says 30
    store.memory.flag(wrong.memory_id, "contradicted", "policy is 30 days for every plan")
    # asked again after the flag: recall leaves the memory out, and says so
    flow.run({"question": "How long is my refund window?"}, store=store, subject="cust-1", env={"model": model})


RECIPES = [
    ("1. Slowest stages (mean and worst, ms)", """
        SELECT stage, count(*) AS runs,
               round(avg(epoch_us(ended_at) - epoch_us(started_at)) / 1000, 2) AS mean_ms,
               round(max(epoch_us(ended_at) - epoch_us(started_at)) / 1000, 2) AS max_ms
        FROM steps GROUP BY stage ORDER BY mean_ms DESC"""),
    ("2. Runs where the memory 'User's refund window is 90 days' was injected", """
        SELECT u.run_id[1:8] AS run, r.subject, json_extract_string(r.input, '$.question') AS question,
               u.rank, round(u.score, 3) AS score
        FROM memory_uses u JOIN memories m USING (memory_id) JOIN runs r USING (run_id)
        WHERE u.outcome = 'injected' AND m.text = 'User''s refund window is 90 days'
        ORDER BY r.started_at"""),
    ("3. Answers given with a memory that has since been flagged", """
        SELECT r.run_id[1:8] AS run, r.subject, m.text AS flagged_memory, m.review_state,
               json_extract_string(r.output, '$.answer')[1:60] AS answer
        FROM memory_uses u JOIN memories m USING (memory_id) JOIN runs r USING (run_id)
        WHERE u.outcome = 'injected' AND m.review_state IN ('stale', 'contradicted') AND r.status = 'ok'
        ORDER BY r.started_at"""),
    ("4. Tokens and failures per model", """
        SELECT model, count(*) AS calls, sum(input_tokens) AS input_tokens, sum(output_tokens) AS output_tokens,
               count(error) AS failed, any_value(error) FILTER (WHERE error IS NOT NULL) AS an_error
        FROM model_calls GROUP BY model"""),
    ("5. What recall left out, and why", """
        SELECT split_part(reason, ':', 1) AS reason, count(*) AS times, any_value(m.text) AS example
        FROM memory_uses u JOIN memories m USING (memory_id)
        WHERE outcome = 'excluded' GROUP BY 1 ORDER BY times DESC"""),
]


def main() -> None:
    with Store(":memory:") as store:
        fill(store)
        runs = store.sql("SELECT count(*), count(*) FILTER (WHERE status = 'failed') FROM runs").fetchall()[0]
        print(f"{runs[0]} runs recorded ({runs[1]} failed).\n")
        for title, query in RECIPES:
            print(title)
            store.sql(query).show(max_width=140)


if __name__ == "__main__":
    main()
