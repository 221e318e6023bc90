"""Property tests: random pipelines whose true dependencies are known by construction.

Each stage is a random sequence of reads and writes over five int fields; a write's
value is computed from every value the stage read before it. A reference model
simulates the pipeline independently of the engine and tracks, per field, the set
of steps that truly contributed to its current value: the writing step, the
contributors of every read its stage made before the write (transitively), and —
for a stage in a branch arm — the decider step and the contributors of what the
decider read. Then:
(a) replaying the write log (`run.state_at(last step)`) reproduces `run.output`;
(b) `run.backtrack(field).steps` is exactly the contributing set: no more, no fewer.
"""
from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from tracemem import Pipeline

FIELDS = ("f0", "f1", "f2", "f3", "f4")
ALL = FIELDS + ("lst",)


class Five(BaseModel):
    f0: int = 0
    f1: int = 1
    f2: int = 2
    f3: int = 3
    f4: int = 4
    lst: list[int] = []


Op = tuple  # ("r", field) | ("w", field, const) | ("a", const): append to `lst`; reading `lst` sums it


@dataclass
class StagePlan:
    ops: list[Op]


@dataclass
class Plan:
    before: list[StagePlan]
    decider_reads: list[str] | None  # None: no branch
    arms: dict[str, list[StagePlan]]
    after: list[StagePlan]


field = st.sampled_from(FIELDS)
op = st.one_of(st.tuples(st.just("r"), st.sampled_from(ALL)), st.tuples(st.just("w"), field, st.integers(-5, 5)),
               st.tuples(st.just("a"), st.integers(-5, 5)))
stage_plan = st.builds(StagePlan, st.lists(op, min_size=1, max_size=5))
stages = st.lists(stage_plan, min_size=0, max_size=4)


@st.composite
def plans(draw, branch: bool) -> Plan:
    before = draw(st.lists(stage_plan, min_size=1, max_size=4))
    if not branch:
        return Plan(before, None, {}, [])
    return Plan(before, draw(st.lists(field, min_size=0, max_size=3)),
                {"even": draw(st.lists(stage_plan, min_size=1, max_size=3)), "odd": draw(stages)},
                draw(stages))


def make_stage(plan: StagePlan):
    def stage(s):
        acc = 0
        for o in plan.ops:
            if o[0] == "r":
                value = getattr(s, o[1])
                acc += sum(value) if o[1] == "lst" else value
            elif o[0] == "a":
                s.lst.append(acc + o[1])
            else:
                setattr(s, o[1], acc + o[2])
    return stage


def make_decider(reads: list[str]):
    def decider(s):
        return "even" if sum(getattr(s, f) for f in reads) % 2 == 0 else "odd"
    return decider


def build(plan: Plan):
    p = Pipeline("prop", Five)
    n = 0

    def add_stages(target, stage_plans):
        nonlocal n
        for sp in stage_plans:
            target.then(make_stage(sp), id=f"s{n}")
            n += 1

    add_stages(p, plan.before)
    if plan.decider_reads is not None:
        arms = {}
        for key in ("even", "odd"):
            arm = Pipeline(key, Five)
            add_stages(arm, plan.arms[key])
            arms[key] = arm if plan.arms[key] else "end" if plan.after else None
        if arms["odd"] is None:  # an empty arm with nothing after it: a no-op stage
            arms["odd"] = make_stage(StagePlan([]))
        p.branch(make_decider(plan.decider_reads), arms, id="decider")
        if plan.after:
            p.then(make_stage(plan.after[0]), id="end")
            add_stages(p, plan.after[1:])
    return p.build()


def simulate(plan: Plan, inputs: dict[str, int]):
    """Reference model: final values, and per field the steps that contributed (None = never written)."""
    values = {**inputs, "lst": list(inputs.get("lst", []))}
    prov: dict[str, frozenset[int] | None] = {f: None for f in ALL}
    step = 0

    def contrib(f: str) -> frozenset[int]:
        return prov[f] or frozenset()

    def run_stage(sp: StagePlan, control: frozenset[int]) -> None:
        nonlocal step
        step += 1
        acc, seen = 0, frozenset()
        for o in sp.ops:
            if o[0] == "r":
                acc += sum(values["lst"]) if o[1] == "lst" else values[o[1]]
                seen |= contrib(o[1])
            elif o[0] == "a":  # an append reads the list (`s.lst`), then composes with its last write
                seen |= contrib("lst")
                values["lst"].append(acc + o[1])
                prov["lst"] = seen | control | {step}
            else:
                values[o[1]] = acc + o[2]
                prov[o[1]] = seen | control | {step}

    for sp in plan.before:
        run_stage(sp, frozenset())
    if plan.decider_reads is not None:
        step += 1
        decider_step = step
        key = "even" if sum(values[f] for f in plan.decider_reads) % 2 == 0 else "odd"
        control = frozenset({decider_step}).union(*(contrib(f) for f in plan.decider_reads))
        arm = plan.arms[key]
        if not arm and key == "odd" and not plan.after:
            arm = [StagePlan([])]
        for sp in arm:
            run_stage(sp, control)
        for i, sp in enumerate(plan.after):
            # when the odd arm is empty it jumps straight to `end`; steps after the join are not routed
            run_stage(sp, frozenset())
    return values, prov


inputs_st = st.fixed_dictionaries({f: st.integers(-3, 3) for f in FIELDS},
                                  optional={"lst": st.lists(st.integers(-3, 3), max_size=3)})


def check(plan: Plan, inputs: dict[str, int]) -> None:
    flow = build(plan)
    run = flow.run(inputs)
    values, prov = simulate(plan, inputs)
    assert run.output.model_dump() == values
    # (a) replaying the write log reproduces the final scope
    assert run.state_at(run.steps[-1].step) == run.output
    for f in ALL:
        assert run.value_at(f, run.steps[-1].step) == values[f]
    # (b) backtracking returns exactly the contributing steps
    for f in ALL:
        trace = run.backtrack(f)
        if prov[f] is None:
            assert trace.missing == "never-written"
            assert trace.steps == []
        else:
            assert trace.missing is None and not trace.truncated
            got = [s.step for s in trace.steps]
            assert got == sorted(prov[f]), (f, got, sorted(prov[f]), [(s.step, s.stage) for s in run.steps])


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(plans(branch=False), inputs_st)
def test_linear_replay_and_backtrack_exact(plan, inputs):
    check(plan, inputs)


@SETTINGS
@given(plans(branch=True), inputs_st)
def test_branch_replay_and_backtrack_exact(plan, inputs):
    check(plan, inputs)


def test_replay_at_every_step_matches_simulation_prefix():
    plan = Plan([StagePlan([("r", "f0"), ("w", "f1", 1)]), StagePlan([("r", "f1"), ("w", "f2", 0)])], None, {}, [])
    run = build(plan).run({})
    assert run.state_at(1).f1 == 1 and run.state_at(1).f2 == 2
    assert run.state_at(2).f2 == 1
