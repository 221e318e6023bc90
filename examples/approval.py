"""An agent proposes a refund, pauses for a human's approval, and a second process resumes it.

Process 1 runs the flow: `propose` asks the (scripted) model what to refund, then
`approve` calls `ctx.interrupt(...)` and the run ends `paused`, what it asks in
`run.pending`. Process 2 — started here with `--approve`, as an approver's tool
would be — opens the same DuckDB file, reads what is asked, answers, and the run
carries on: the same run id, step numbers carrying on, `propose` not run again
(process 2's model is never called), the answer recorded as a human input that
the backtrack names, with who gave it.

    python examples/approval.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from pydantic import BaseModel

from tracemem import Pipeline, StageContext
from tracemem.models import ScriptedModel
from tracemem.store import Store


class Approval(BaseModel):
    """The answer a person gives; a resume checks it before anything is committed (a typo leaves the run paused)."""

    approved: bool


class Refund(BaseModel):
    order: str
    complaint: str
    amount: float = 0.0
    reason: str = ""
    approved: bool = False
    outcome: str = ""


def propose(scope: Refund, ctx: StageContext) -> None:
    """Ask the model what to refund (a JSON reply)."""
    reply = ctx.complete(ctx.env["model"], [
        {"role": "system", "content": "Propose a refund as JSON: {\"amount\": EUR, \"reason\": text}."},
        {"role": "user", "content": f"Order {scope.order}: {scope.complaint}"}])
    proposal = json.loads(reply.text)
    scope.amount, scope.reason = proposal["amount"], proposal["reason"]


def approve(scope: Refund, ctx: StageContext) -> None:
    """A human approves or declines: the run pauses here until they answer."""
    decision = ctx.interrupt({"order": scope.order, "amount": scope.amount, "reason": scope.reason},
                             expect=Approval)
    scope.approved = decision.approved


def pay(scope: Refund) -> None:
    scope.outcome = f"refunded {scope.amount:.2f} EUR on order {scope.order}" if scope.approved else "refund declined"


refund = Pipeline("refund", Refund).then(propose).then(approve).then(pay).build()


def model() -> ScriptedModel:
    return ScriptedModel(default=json.dumps({"amount": 24.9, "reason": "the mug arrived broken"}), name="support-llm")


def approver(db: str, run_id: str, name: str) -> None:
    """Process 2: read what the paused run asks, answer it, and let it finish."""
    llm = model()
    with Store(db) as store:
        asks = store.run(run_id).pending
        print(f"process 2 ({os.getpid()}): {name} reads the request: {json.dumps(asks)}")
        run = refund.resume(run_id, {"approved": asks["amount"] <= 50}, store=store, by=name, env={"model": llm})
    print(f"process 2: run {run_id[:8]} is {run.status}: {run.output.outcome}")
    print(f"process 2: model calls in process 2: {len(llm.calls)}")


def main() -> None:
    if sys.argv[1:2] == ["--approve"]:
        approver(*sys.argv[2:5])
        return
    llm = model()
    with tempfile.TemporaryDirectory() as tmp:
        db = os.path.join(tmp, "refunds.duckdb")
        with Store(db) as store:
            run = refund.run({"order": "A-1042", "complaint": "my mug arrived in pieces"}, store=store,
                             env={"model": llm})
            print(f"process 1 ({os.getpid()}): run {run.run_id[:8]} is {run.status} at stage "
                  f"'{run.resume_at['stage']}', asking {json.dumps(run.pending)}")
            print(f"process 1: model calls in process 1: {len(llm.calls)}")
            print("paused runs:", [(r["run_id"][:8], r["pending"]["amount"]) for r in store.runs(status="paused")])
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--approve", db, run.run_id, "maria"],
                              capture_output=True, text=True, timeout=120)
        print(done.stdout, end="")
        if done.returncode != 0:
            raise SystemExit(f"the approver process failed:\n{done.stderr}")
        with Store(db, read_only=True) as store:
            final = store.run(run.run_id)
            print("\nsteps:", ", ".join(f"{s.step} {s.stage} ({s.status})" for s in final.steps))
            print(final.backtrack("outcome").explain())


if __name__ == "__main__":
    main()
