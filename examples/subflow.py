"""A pipeline inside a pipeline: a reusable `moderate` flow run as a subflow of a comment pipeline.

The child flow has its own scope; `inputs` maps child fields from parent
fields and `outputs` maps parent fields from child fields. The child is
recorded as its own run, linked to the parent step (`runs.parent_run_id`), so
it can be queried alone or with its parent, and the parent's backtrack of a
value the child produced names the subflow step.

    python examples/subflow.py
"""
from __future__ import annotations

from pydantic import BaseModel

from tracemem import Pipeline, decide
from tracemem.store import Store

BLOCKLIST = ("idiot", "scam")


class Moderation(BaseModel):
    text: str = ""
    flagged_words: list[str] = []
    verdict: str = ""


def scan(scope: Moderation) -> None:
    scope.flagged_words = [w for w in BLOCKLIST if w in scope.text.lower()]


def judge(scope: Moderation) -> str:
    return decide(scope, [("contains a blocked word", lambda s: bool(s.flagged_words), "reject")], default="accept")


def reject(scope: Moderation) -> None:
    scope.verdict = "rejected: " + ", ".join(scope.flagged_words)


def accept(scope: Moderation) -> None:
    scope.verdict = "accepted"


MODERATE = Pipeline("moderate", Moderation).then(scan).branch(judge, {"reject": reject, "accept": accept}).build()


class Comment(BaseModel):
    author: str = ""
    body: str = ""
    clean_body: str = ""
    moderation: str = ""
    published: bool = False


def normalize(scope: Comment) -> None:
    scope.clean_body = " ".join(scope.body.split())


def publish(scope: Comment) -> None:
    scope.published = scope.moderation == "accepted"


FLOW = (Pipeline("comments", Comment)
        .then(normalize)
        .subflow(MODERATE, inputs={"text": "clean_body"}, outputs={"moderation": "verdict"})
        .then(publish)
        .build())


def main() -> None:
    print(FLOW.to_mermaid(), "\n")
    with Store(":memory:") as store:
        for author, body in [("kim", "Great  write-up,\n thanks!"), ("bot-77", "Total SCAM, click here")]:
            run = FLOW.run({"author": author, "body": body}, store=store)
            child = run.children[0]
            print(f"{author}: moderation={run.output.moderation!r} published={run.output.published} "
                  f"(child run {child.run_id[:8]} of '{child.pipeline}', steps: "
                  f"{', '.join(s.stage for s in child.steps)})")

        print("\nParent and child runs, from SQL:")
        store.sql("SELECT run_id[1:8] AS run, pipeline, parent_run_id[1:8] AS parent, parent_step, status, "
                  "json_extract_string(output, '$.verdict') AS verdict FROM runs ORDER BY started_at").show()

        print("Backtrack of the rejected comment's `published`, in the parent run:\n")
        print(run.backtrack("published").explain())
        print("\n…and of `verdict` inside the child run:\n")
        print(child.backtrack("verdict").explain())


if __name__ == "__main__":
    main()
