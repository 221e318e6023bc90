"""tracemem: agent pipelines that explain themselves.

Every stage, read, write, decision, model call, prompt section and memory use is
recorded, so any answer can be traced back to what produced it.

How a run flows (the files in the order a run passes through them; the handle goes
down, data never calls back up: the runner emits typed events, and listeners — the
store, an OpenTelemetry export, a stream, your own — each keep their own state):

```mermaid
flowchart LR
    P["flow/pipeline.py<br/>Pipeline → Flow"] --> R["flow/runner.py<br/>one step path"]
    R --> K["flow/kinds.py<br/>stage, branch, loop"]
    R --> S["scope/recorder.py<br/>reads and writes"]
    R --> U["run.py<br/>the recorded Run"]
    R -- events --> L["store/write/listener.py<br/>journal, queue"]
    L --> W["store/write/writer.py<br/>batches → tables"]
```

1. `flow/pipeline.py`: `Pipeline(...).then(...).build()` compiles a `Program`
   (`flow/program.py`); `Flow.run` gathers the listeners and starts the runner.
2. `flow/runner.py`: every step goes one path — begin, call the stage with its
   scope view and context, conclude, record — and is told to the listeners as
   events (`flow/events.py`); `flow/kinds.py` says what each node kind does around it.
3. `scope/recorder.py` (with `scope/schema.py`): each read with the write it saw,
   each write validated per field and buffered until the stage ends.
4. `run.py`: the `Run` the runner returns and `store.run(id)` loads back.
5. `store/write/listener.py`: the store's listener journals what must survive a crash
   (`store/write/journal.py`) and queues it; `store/write/writer.py` puts it into the
   tables in batches (`store/write/rows.py`).
6. `trace/walk.py`: `run.backtrack(path)` walks the record into a `Trace`.
"""
from .errors import (AnswerError, ForkConflictError, LoopLimitError, PathError, PipelineError, ResumeError,
                     RunCancelled, RunFailed, ScopeReadError, ScopeWriteError, StageError, StageTimeout, StoreError,
                     TracememError, UsageError)
from .flow.context import StageContext
from .flow.decide import decide
from .flow.pipeline import Flow, Pipeline
from .flow.replay import ReplayModel
from .record import Decision, Read, Step, Write
from .run import Run
from .scope.schema import PerTurn

__all__ = [
    "AnswerError", "Decision", "Flow", "ForkConflictError", "LoopLimitError", "PathError", "PerTurn", "Pipeline",
    "PipelineError", "Read", "ReplayModel", "ResumeError", "Run", "RunCancelled", "RunFailed", "ScopeReadError", "ScopeWriteError",
    "StageContext", "StageError", "StageTimeout", "Step", "StoreError", "TracememError", "UsageError", "Write",
    "decide",
]
