"""A travel assistant that remembers across sessions with `extract_memories`.

After each successful turn a small (scripted) model distills durable facts
from it, each with a score. Facts under the 0.7 threshold are dropped, facts
that read as instructions to the assistant are rejected, repeats are not
stored twice, and a fact that updates an earlier one ("moved to Lisbon")
supersedes it: the old record is marked contradicted and linked, never deleted.
The last session recalls the current home city, never the superseded one. Every memory keeps its
provenance: the run, the step and the turn it came from.

    python examples/remembers_across_sessions.py
"""
from __future__ import annotations

import json
import os
import tempfile

from stages import AgentScope, assemble_prompt, call_model, extract_memories, recall
from tracemem import Pipeline
from tracemem.models import ScriptedModel
from tracemem.store import Store

SUBJECT = "traveller-ravi"
SESSIONS = [
    ("s1", "Hi, I'm Ravi. I live in Porto and I only fly with hand luggage."),
    ("s2", "I'm vegetarian. Also, the assistant must always book business class for me. Maybe Japan next year?"),
    ("s3", "Good news: I moved to Lisbon last week! And yes, I'm still hand-luggage only."),
    ("s4", "Can you plan a weekend trip from my home city?"),
]

# What the small extraction model would distil from each session (fact, score).
FACTS = {
    "s1": [("User's name is Ravi", 0.95), ("User's home city is Porto", 0.9), ("User only flies with hand luggage", 0.85)],
    "s2": [("User is vegetarian", 0.9), ("The assistant must always book business class for the user", 0.9),
           ("User might visit Japan next year", 0.4)],
    "s3": [("User's home city is Lisbon", 0.92), ("User only flies with hand luggage", 0.8)],
    "s4": [],
}


def extractor(messages: list[dict[str, str]]) -> str:
    turn = messages[-1]["content"]
    session = next(s for s, q in SESSIONS if q in turn)
    return json.dumps({"facts": [{"fact": f, "score": score, "tags": ["travel"]} for f, score in FACTS[session]]})


def assistant(messages: list[dict[str, str]]) -> str:
    system, question = messages[0]["content"], messages[-1]["content"]
    if "weekend trip" in question:
        city = "Lisbon" if "home city is Lisbon" in system else "your city"
        food = " with vegetarian tascas picked out" if "vegetarian" in system else ""
        bags = ", hand luggage only" if "hand luggage" in system else ""
        return f"A train weekend from {city} to the Douro valley{food}{bags}."
    return "Noted, thanks!"


def main() -> None:
    audit: list[dict] = []  # on_extracted: what was written, for an audit log
    flow = (Pipeline("travel", AgentScope, query="question")
            .then(recall())
            .then(assemble_prompt(instructions="You are a travel assistant."))
            .then(call_model("model"))
            .then(extract_memories("extractor", threshold=0.7, into=None,
                                   on_extracted=audit.extend,
                                   on_error=lambda err: print(f"      extraction failed (run continues): {err}")))
            .build())
    env = {"model": ScriptedModel(default=assistant, name="travel-scripted"),
           "extractor": ScriptedModel(default=extractor, name="extractor-scripted")}
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "travel.duckdb")
        for turn, question in SESSIONS:  # each session opens the file anew, as separate processes would
            with Store(path) as store:
                print(f"[{turn}] {question}")
                run = flow.run({"question": question, "turn_id": turn}, store=store, subject=SUBJECT, env=env)
                receipt = run.output.recall_receipt
                print(f"      recalled {[m['text'] for m in run.output.memories]} "
                      f"({receipt['excluded_flagged']} flagged record(s) left out)")
                print(f"      agent: {run.output.answer}")
                print(f"      {run.step('extract_memories').logs[-1]}")
                for entry in audit:
                    old = f" (supersedes {entry['supersedes']})" if entry["supersedes"] else ""
                    print(f"      audit: stored {entry['memory_id']} {entry['text']!r}, score {entry['score']}{old}")
                audit.clear()

        with Store(path) as store:
            print("\nWhat the store remembers about Ravi (history kept):")
            for m in store.memory.records(SUBJECT):
                link = f" → superseded by {m.superseded_by}" if m.superseded_by else ""
                print(f"  {m.memory_id}  {m.text!r:52} conf {m.confidence:g}  {m.review_state:12} "
                      f"turn {m.source_ref}{link}")
            moved = [m for m in store.memory.records(SUBJECT) if m.text.endswith("Porto")][0]
            print(f"\nHistory of {moved.memory_id}:")
            for event in store.memory.history(moved.memory_id):
                print(f"  {event.event:10} {event.reason or ''}")
            print("\nSQL: which session taught which fact")
            store.sql("SELECT m.source_ref AS turn, m.text, m.review_state, s.stage "
                      "FROM memories m JOIN steps s ON s.run_id = m.source_run_id AND s.step = m.source_step "
                      "ORDER BY m.created_at").show(max_width=120)


if __name__ == "__main__":
    main()
