"""What the runner does around a subflow step: the child flow runs as its own run inside the step.

The child gets the parent's store, sinks, env, subject and event feed, and records the parent's run id and
step as its parent; its outputs are written into the parent's scope through the step's view (reads and writes
recorded like any stage's), and a `subflows` row maps them for backtracking. A paused child pauses the
parent; resuming the parent resumes the child.

`Execution` (flow/runner.py) inherits this, as it does `ParallelSteps`: it uses the runner's step path
(`_step`, `_finish`) and builds the child as `type(self)(...)`, since runner.py imports this module.
"""
from __future__ import annotations

import json
from typing import Awaitable, Callable

from ..errors import TracememError
from ..scope.tracked import unwrap
from ..scope.view import new_view
from .interrupt import Pause
from .program import Instruction
from .spec import SubflowNode
from .steps import Begun
from .sync import run_sync


class SubflowSteps:
    """The subflow node kind of `Execution` (flow/runner.py)."""

    async def _do_subflow(self, ins: Instruction, pc: int) -> int:
        node: SubflowNode = ins.node

        async def body(begun: Begun) -> None:
            view = new_view(self.program.view_class, begun.rec)
            if callable(node.inputs):
                child_inputs = unwrap(node.inputs(view))
            else:
                child_inputs = {c: unwrap(getattr(view, p)) for c, p in node.inputs.items()}
            resumed = self.resume_child
            if resumed is not None and resumed[0] == begun.spec.id:  # its child paused: resume that run
                self.resume_child, exe = None, resumed[1]
            else:
                exe = type(self)(node.flow.program, child_inputs, env=self.env, store=self.store,
                                 subject=self.subject, sinks=self.sinks, parent=(self.run.run_id, begun.rec.step))
                exe.replay = self.replay  # a fork replaying a record replays its subflows' calls too
            exe.events = self.events
            coro = exe.execute(False, async_mode=self.async_mode)
            child = await coro if self.async_mode else run_sync(coro, f"subflow '{node.flow.name}' suspended")
            begun.child_run_id = child.run_id
            self.run.children = [c for c in self.run.children if c.run_id != child.run_id] + [child]
            if child.status == "paused":  # the parent pauses with it; resuming the parent resumes the child
                begun.rec.pause = Pause(child.pending, begun.spec.id, "subflow", begun.rec.step, child.run_id)
                return
            if child.status != "ok":
                raise TracememError(f"subflow '{node.flow.name}' (child run {child.run_id}) failed: {child.error}")
            for parent_field, child_field in node.outputs.items():
                setattr(view, parent_field, getattr(child.output, child_field))
            begun.rec.add_row("subflows", {  # kept in the file: backtracking maps outputs to the child
                "run_id": self.run.run_id, "step": begun.rec.step, "child_run_id": child.run_id,
                "inputs": None if callable(node.inputs) else json.dumps(dict(node.inputs)),
                "outputs": json.dumps(dict(node.outputs))})

        begun, _ = await self._step(ins, ins.spec, "subflow", body)  # type: ignore[arg-type]
        self._finish(begun)
        return pc + 1


SUBFLOW_HANDLERS: dict[str, Callable[..., Awaitable[int]]] = {"subflow": SubflowSteps._do_subflow}
