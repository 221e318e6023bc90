"""tracemem: agent pipelines that explain themselves.

Every stage, read, write, decision, model call, prompt section and memory use is
recorded, so any answer can be traced back to what produced it.

How a run flows (the folders in the order a run passes through them; the handle
goes down, data never calls back up):

```mermaid
flowchart LR
    P["flow/pipeline.py<br/>Pipeline → Flow"] --> R["flow/runner.py<br/>executes the Program"]
    R --> S["scope/recorder.py<br/>records reads and writes"]
    R --> K["flow/sinks.py<br/>store, OpenTelemetry"]
    K --> W["store/writer.py<br/>batches, journal → DuckDB"]
    R --> U["run.py<br/>the recorded Run"]
    U --> T["trace/walk.py<br/>backtrack → Trace"]
```

1. `flow/pipeline.py`: `Pipeline(...).then(...).build()` compiles a `Program`
   (`flow/program.py`); `Flow.run` assembles the sinks and starts the runner.
2. `flow/runner.py`: one step path for every node kind — begin, call the stage
   with its scope view (`scope/view.py`) and context (`flow/context.py`),
   commit, hand the finished step to the sinks.
3. `scope/recorder.py`: each read with its source, each write validated and buffered.
4. `store/writer.py`: the store's sink queues finished runs and writes them in
   columnar batches (or journals each stage, for durability "stage").
5. `run.py`: the `Run` the runner returns and `store.run(id)` loads back.
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
