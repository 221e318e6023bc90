"""A credit decision whose every rule leaves evidence, and the backtrack of the outcome.

`decide(scope, rules)` evaluates every rule (so the evidence is complete),
records for each whether it matched and the scope values it read, and the
first match chooses the branch. Three applicants go through the same
pipeline; for each we print the evidence and, for the declined one, the
backtrack of the decision: the values it came from and the rule that routed it.

    python examples/credit_decision.py
"""
from __future__ import annotations

import json

from pydantic import BaseModel

from tracemem import Pipeline, decide
from tracemem.store import Store


class Application(BaseModel):
    applicant: str = ""
    income: float = 0  # yearly
    monthly_debt: float = 0
    credit_score: int = 0
    debt_to_income: float = 0
    decision: str = ""
    reason: str = ""


def ratios(scope: Application) -> None:
    """Debt-to-income ratio from monthly debt and yearly income."""
    scope.debt_to_income = round(scope.monthly_debt * 12 / scope.income, 3) if scope.income else 1.0


def underwrite(scope: Application) -> str:
    return decide(scope, [
        ("credit score below 580", lambda s: s.credit_score < 580, "decline"),
        ("debt-to-income above 43%", lambda s: s.debt_to_income > 0.43, "decline"),
        ("score 720+ and income 60k+", lambda s: s.credit_score >= 720 and s.income >= 60_000, "approve"),
    ], default="manual_review")


def approve(scope: Application) -> None:
    scope.decision = "approved"
    scope.reason = f"score {scope.credit_score}, DTI {scope.debt_to_income:.0%}"


def decline(scope: Application) -> None:
    scope.decision = "declined"
    scope.reason = f"DTI {scope.debt_to_income:.0%}" if scope.debt_to_income > 0.43 else f"score {scope.credit_score}"


def manual_review(scope: Application) -> None:
    scope.decision = "manual review"
    scope.reason = "no automatic rule applies"


FLOW = (Pipeline("credit", Application)
        .then(ratios)
        .branch(underwrite, {"approve": approve, "decline": decline, "manual_review": manual_review})
        .build())

APPLICANTS = [
    {"applicant": "Ada", "income": 95_000, "monthly_debt": 1_200, "credit_score": 760},
    {"applicant": "Ben", "income": 48_000, "monthly_debt": 2_100, "credit_score": 690},
    {"applicant": "Cy", "income": 52_000, "monthly_debt": 900, "credit_score": 650},
]


def main() -> None:
    with Store(":memory:") as store:
        runs = {a["applicant"]: FLOW.run(a, store=store) for a in APPLICANTS}
        for name, run in runs.items():
            d = run.decisions[0]
            print(f"{name}: {run.output.decision} ({run.output.reason}) — branch '{d.chosen}'"
                  f"{' (default: no rule matched)' if d.evidence['used_default'] else ''}")
            for rule in d.evidence["rules"]:
                mark = "✔" if rule["matched"] else "·"
                print(f"    {mark} {rule['rule']:28} read {json.dumps(rule['read'])}")

        print("\nWhy was Ben declined? Backtrack of `decision`:\n")
        print(runs["Ben"].backtrack("decision").explain())

        print("\nSQL over the evidence: which rule decided each application")
        store.sql("""
            SELECT json_extract_string(r.input, '$.applicant') AS applicant, d.chosen,
                   coalesce((SELECT json_extract_string(x, '$.rule')
                             FROM unnest(json_extract(d.evidence, '$.rules[*]')) AS t(x)
                             WHERE json_extract(x, '$.matched')::BOOLEAN LIMIT 1), '(default)') AS deciding_rule
            FROM decisions d JOIN runs r USING (run_id) ORDER BY r.started_at""").show()


if __name__ == "__main__":
    main()
