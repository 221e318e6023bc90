"""What the runner does around a subflow step: the child flow runs as its own run inside the step.

The child gets the parent's store, listeners, env, subject and event feed, and records the parent's run id
and step as its parent; its outputs are written into the parent's scope through the step's view (reads and
writes recorded like any stage's), and a `subflows` row maps them for backtracking. A paused child pauses the
parent; resuming the parent resumes the child. The child is built as `type(exe)(...)`, a
`Runner` like its parent: this module builds on the runner and never imports the node kinds.
"""
from __future__ import annotations

import json

from ..errors import TracememError
from ..scope.recorder import new_view
from ..scope.tracked import unwrap
from .interrupt import Pause
from .program import Instruction
from .runner import Execution
from .spec import SubflowNode
from .steps import Begun, StartPoint
from .sync import run_sync


async def run_subflow(exe: Execution, ins: Instruction, pc: int) -> int:
    """A subflow: the child flow runs as its own run inside this step."""
    node: SubflowNode = ins.node

    async def body(begun: Begun) -> None:
        view = new_view(exe.program.view_class, begun.rec)
        if callable(node.inputs):
            child_inputs = unwrap(node.inputs(view))
        else:
            child_inputs = {c: unwrap(getattr(view, p)) for c, p in node.inputs.items()}
        resumed = exe.resume_child
        if resumed is not None and resumed[0] == begun.spec.id:  # its child paused: resume that run
            exe.resume_child, child_exe = None, resumed[1]
        else:  # (a fork replaying a record replays its subflows' calls and effects too)
            child_exe = type(exe)(node.flow.program, child_inputs, env=exe.env, store=exe.store,
                                  subject=exe.subject, listeners=exe.listeners, parent=(exe.run.run_id, begun.rec.step),
                                  start=StartPoint(replay=exe.replay, effects=exe.effects))
        child_exe.events = exe.events
        coro = child_exe.execute(False, async_mode=exe.async_mode)
        child = await coro if exe.async_mode else run_sync(coro, f"subflow '{node.flow.name}' suspended")
        begun.child_run_id = child.run_id
        exe.run.children = [c for c in exe.run.children if c.run_id != child.run_id] + [child]
        if child.status == "paused":  # the parent pauses with it; resuming the parent resumes the child
            begun.rec.pause = Pause(child.pending, begun.spec.id, "subflow", begun.rec.step, child.run_id)
            return
        if child.status != "ok":
            raise TracememError(f"subflow '{node.flow.name}' (child run {child.run_id}) failed: {child.error}")
        for parent_field, child_field in node.outputs.items():
            setattr(view, parent_field, getattr(child.output, child_field))
        begun.rec.add_row("subflows", {  # kept in the file: backtracking maps outputs to the child
            "run_id": exe.run.run_id, "step": begun.rec.step, "child_run_id": child.run_id,
            "inputs": None if callable(node.inputs) else json.dumps(dict(node.inputs)),
            "outputs": json.dumps(dict(node.outputs))})

    await exe.step(ins, ins.spec, "subflow", body=body)  # type: ignore[arg-type]
    return pc + 1
