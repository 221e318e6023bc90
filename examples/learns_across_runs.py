"""An IT helpdesk triage agent that improves across runs with `load_snapshot`.

The first time it meets a VPN ticket no rule matches, so it escalates to a
person, who resolves it with the network team. The next similar ticket finds
that past run (cosine ≥ 0.7 on the question, same embedder), reads who
resolved it, and routes straight to the network team; the decision's evidence
says why. An unrelated ticket finds nothing above the threshold and gets no
past context at all (no fallback). Finally the backtrack of the fast route
crosses into the past run's own decision.

    python examples/learns_across_runs.py
"""
from __future__ import annotations

from pydantic import BaseModel

from stages import load_snapshot
from tracemem import Pipeline, decide
from tracemem.store import Store

# What the on-call engineer decided when a ticket was escalated (the human in the loop).
HUMAN_RESOLUTION = {"vpn": "network", "printer": "facilities", "outlook": "desktop"}


class Ticket(BaseModel):
    question: str = ""
    snapshot: str = ""  # what load_snapshot found: past runs, their score, who resolved them
    resolved_by: str = ""
    answer: str = ""


def triage(scope: Ticket) -> str:
    return decide(scope, [
        ("a similar past ticket was resolved by the network team", lambda s: '"network"' in s.snapshot, "network"),
        ("a similar past ticket was resolved by desktop support", lambda s: '"desktop"' in s.snapshot, "desktop"),
        ("mentions a printer", lambda s: "printer" in s.question.lower(), "facilities"),
    ], default="escalate")


def network(scope: Ticket) -> None:
    scope.resolved_by = "network"
    scope.answer = "Routed to the network team (as a similar ticket was before)."


def desktop(scope: Ticket) -> None:
    scope.resolved_by = "desktop"
    scope.answer = "Routed to desktop support (as a similar ticket was before)."


def facilities(scope: Ticket) -> None:
    scope.resolved_by = "facilities"
    scope.answer = "Routed to facilities."


def escalate(scope: Ticket) -> None:
    topic = next((k for k in HUMAN_RESOLUTION if k in scope.question.lower()), None)
    scope.resolved_by = HUMAN_RESOLUTION.get(topic, "helpdesk")
    scope.answer = f"Escalated to the on-call engineer, who handed it to {scope.resolved_by}."


def build():
    return (Pipeline("helpdesk", Ticket, query="question")  # the question is what past runs are matched on
            .then(load_snapshot(projection="answer", answer_path="resolved_by", min_score=0.7))
            .branch(triage, {"network": network, "desktop": desktop, "facilities": facilities, "escalate": escalate})
            .build())


TICKETS = [
    "My VPN disconnects every hour",
    "VPN keeps disconnecting every hour since Monday",
    "The printer on floor 3 is jammed",
    "Outlook will not open after the update",
    "Outlook does not open since the update",
]


def main() -> None:
    flow = build()
    runs = []
    with Store(":memory:") as store:  # the hashing embedder embeds each run's question
        for question in TICKETS:
            run = flow.run({"question": question}, store=store)
            runs.append(run)
            rows = store.sql("SELECT source_run_id, score FROM snapshot_uses WHERE run_id = ?",
                             [run.run_id]).fetchall()
            seen = f"past run {rows[0][0][:8]} at cosine {rows[0][1]:.2f}" if rows else "no past run ≥ 0.7"
            print(f"{question!r}\n    snapshot: {seen}\n    route: {run.decisions[0].chosen}  →  {run.output.answer}")
        escalations = store.sql("SELECT count(*) FROM decisions WHERE chosen = 'escalate'").fetchall()[0][0]
        print(f"\n{escalations} of {len(TICKETS)} tickets needed a person; the repeats were routed from experience.")

        fast = runs[1]
        print(f"\nWhat the second VPN ticket saw:\n{fast.output.snapshot}")
        evidence = fast.decisions[0].evidence
        matched = next(r for r in evidence["rules"] if r["matched"])
        print(f"\nDecision evidence: rule {matched['rule']!r} matched → {matched['branch']}")
        print("\nBacktrack of its route, into the past run:\n")
        print(store.backtrack(fast.run_id, "resolved_by").explain(only="run", beyond=2))


if __name__ == "__main__":
    main()
