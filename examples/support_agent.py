"""A multi-turn support agent that uses a remembered fact, and the backtrack that shows where it came from.

Each turn is one run of recall → assemble_prompt → call_model, continuing the
previous turn's conversation (`resume=`). Earlier, in an onboarding session,
the agent remembered that Biscuit the dog is allergic to chicken; in turn 2
the scripted model sees that line in the prompt's [Memory] section and uses
it. The backtrack of turn 2's answer names the model call, the exact prompt
line, the memory and the session the memory was extracted from.

    python examples/support_agent.py
"""
from __future__ import annotations

from stages import AgentScope, assemble_prompt, call_model, recall
from tracemem import Pipeline
from tracemem.models import ScriptedModel
from tracemem.store import Store

SUBJECT = "customer-ana"
TURNS = [
    ("t1", "Hi! We're going hiking with the dog on Saturday. Any tips?"),
    ("t2", "What food should I pack for my dog?"),
]


def reply(messages: list[dict[str, str]]) -> str:
    """The scripted model: answers from the system prompt it was given, like a real one would."""
    system, question = messages[0]["content"], messages[-1]["content"]
    if "food" in question:
        if "allergic to chicken" in system:
            return "Pack the salmon treats and skip anything with chicken: Biscuit is allergic to it."
        return "Pack your dog's usual food and plenty of water."
    return "Start early, bring water for both of you, and check the trail allows dogs."


def onboarding(store: Store) -> str:
    """An earlier session that remembered facts (here written directly; see remembers_across_sessions.py)."""
    flow = Pipeline("onboarding", AgentScope).then(lambda s: None, id="intake_form").build()
    run = flow.run({"question": "Our dog Biscuit is allergic to chicken.", "turn_id": "onboarding-1"}, store=store,
                   subject=SUBJECT)
    store.memory.remember(SUBJECT, "User's dog Biscuit is allergic to chicken", confidence=85,
                          source_run_id=run.run_id, source_step=1, source_ref="onboarding-1", run_id=run.run_id)
    store.memory.remember(SUBJECT, "User lives near the Sierra foothills", confidence=70,
                          source_run_id=run.run_id, source_step=1, source_ref="onboarding-1", run_id=run.run_id)
    return run.run_id


def main() -> None:
    flow = (Pipeline("support", AgentScope, query="question")
            .then(recall())
            .then(assemble_prompt(instructions="You are PawPal's support agent. Be practical."))
            .then(call_model("model"))
            .build())
    model = ScriptedModel(default=reply, name="pawpal-scripted")
    with Store(":memory:") as store:
        onboarding(store)
        previous = None
        for turn, question in TURNS:
            run = flow.run({"question": question, "turn_id": turn}, store=store, subject=SUBJECT,
                           env={"model": model}, resume=previous)
            print(f"[{turn}] user:  {question}")
            print(f"[{turn}] agent: {run.output.answer}")
            used = [m["text"] for m in run.output.memories]
            print(f"      memories in the prompt: {used or 'none'}")
            previous = run
        print(f"\nThe conversation now holds {len(previous.output.messages)} messages.")

        trace = store.backtrack(previous.run_id, "answer")
        top = trace.influence()[0]
        print(f"\nThe prompt line most like turn 2's answer (correlational, score {top['score']:.2f}): "
              f"{top['text'].strip()}")
        print("\nWhy did the agent say that? The backtrack of turn 2's answer, through that memory:\n")
        print(trace.explain(focus=f"m:{top['memory_id']}", beyond=1, max_lines=10))


if __name__ == "__main__":
    main()
