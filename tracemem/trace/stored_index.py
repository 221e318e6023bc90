"""`StoredIndex`: a `RunIndex` that reads a run from its store a block of steps at a time.

Why: a backtrack starts at one write and walks back through the few steps it depends on, but a
`RunIndex` is built over the whole run: a 200,000-step run is loaded and indexed (seconds) to draw
a graph of a hundred nodes. This index holds the run's head alone and loads the steps the walk
reaches, `BLOCK` at a time with their reads, writes, decisions and rows (store/read/load.py
`load_runs(steps=…)`); the questions that span the run (the write of a field before another, the
last write of a path, a prompt's sections, the fields written) are one indexed query each. It
answers exactly what `RunIndex` answers: the viewer's backtrack page uses it for every run.
"""
from __future__ import annotations

import json
from typing import Any, Callable, Iterator, Optional

from ..record import Read, Write
from ..scope.paths import parse_path

__all__ = ["BLOCK", "StoredIndex"]

BLOCK = 256  # steps loaded at a time
_ROOT = "(path = ? OR starts_with(path, ? || '.') OR starts_with(path, ? || '['))"
_COMMITTED = "step NOT IN (SELECT step FROM steps WHERE run_id = ? AND status <> 'ok')"


class _Lazy:
    """A read-only mapping whose entries appear as the blocks holding their steps are loaded."""

    def __init__(self, load: Callable[[int], None], step_of: Callable[[Any], int]) -> None:
        self.data: dict[Any, Any] = {}
        self.load, self.step_of = load, step_of

    def get(self, key: Any, default: Any = None) -> Any:
        if key is None:
            return default
        self.load(self.step_of(key))
        return self.data.get(key, default)

    def __getitem__(self, key: Any) -> Any:
        self.load(self.step_of(key))
        return self.data[key]

    def __contains__(self, key: Any) -> bool:
        return self.get(key) is not None

    def __iter__(self) -> Iterator[Any]:
        raise TypeError("a stored index is read by key; it never lists a whole run")


class StoredIndex:
    """The lookups `RunIndex` offers, over `run` (its head, loaded without steps) read from `store` as needed."""

    def __init__(self, store: Any, run: Any, load_steps: Callable[[int, int], Any], block: int = BLOCK) -> None:
        self.run = run
        self.block = block
        self.store = store
        self.load_steps = load_steps  # (first, last) -> the run holding those steps alone
        self.steps = _Lazy(self._load, lambda step: step)
        self.reads = _Lazy(self._load, lambda step: step)
        self.writes = _Lazy(self._load, lambda key: key[0])
        self.decisions = _Lazy(self._load, lambda step: step)
        self._rows: dict[str, dict[int, list[dict[str, Any]]]] = {}
        self._blocks: set[int] = set()
        self.inputs: dict[str, Any] = json.loads(run.input_json) if run.input_json else {}
        self.given = set(self.inputs) if run.continues else set()

    def _load(self, step: int) -> None:
        block = step // self.block
        if block in self._blocks:
            return
        self._blocks.add(block)
        part = self.load_steps(block * self.block, block * self.block + self.block - 1)
        failed = {s.step for s in part.steps if s.status != "ok"}
        for s in part.steps:
            self.steps.data[s.step] = s
        for r in part.reads:
            self.reads.data.setdefault(r.step, []).append(r)
        for w in part.writes:
            if w.step not in failed:
                self.writes.data[(w.step, w.seq)] = w
        for d in part.decisions:
            self.decisions.data[d.step] = d
        for table, found in part.rows.items():
            by_step = self._rows.setdefault(table, {})
            for row in found:
                by_step.setdefault(row.get("step"), []).append(row)  # type: ignore[arg-type]

    def _query(self, sql: str, params: list[Any]) -> list[tuple]:
        with self.store.lock:
            return [tuple(r) for r in self.store.backend.con.execute(sql, params).fetchall()]

    def _writes(self, where: str, params: list[Any], order: str, limit: int) -> list[Write]:
        rid = self.run.run_id
        found = self._query(f"SELECT step, seq, path, verb, value FROM writes WHERE run_id = ? AND {where} AND "
                            f"{_COMMITTED} ORDER BY {order} LIMIT {int(limit)}", [rid, *params, rid])
        return [Write(*row) for row in found]

    # -- what RunIndex answers -------------------------------------------------------------------
    def node_write(self, w: Write) -> str:
        return f"w:{self.run.run_id}:{w.step}:{w.seq}"

    def rows(self, table: str, step: int) -> list[dict[str, Any]]:
        self._load(step)
        return self._rows.get(table, {}).get(step, [])

    def model_output(self, read: Read) -> bool:
        return read.source_step is not None and bool(self.rows("model_calls", read.source_step))

    def previous(self, w: Write) -> Optional[Write]:
        root = str(parse_path(w.path)[0])
        found = self._writes(f"{_ROOT} AND (step < ? OR (step = ? AND seq < ?))",
                             [root, root, root, w.step, w.step, w.seq], "step DESC, seq DESC", 1)
        return found[0] if found else None

    def last_upto(self, field: str, step: int) -> Optional[Write]:
        found = self._writes(f"{_ROOT} AND step <= ?", [field, field, field, step], "step DESC, seq DESC", 1)
        return found[0] if found else None

    def last_write(self, path: str) -> Optional[Write]:
        wanted = parse_path(path)
        root = str(wanted[0])
        before: Optional[tuple[int, int]] = None
        while True:  # newest first, a batch at a time: usually the first is it
            where, params = _ROOT, [root, root, root]
            if before is not None:
                where += " AND (step < ? OR (step = ? AND seq < ?))"
                params += [before[0], before[0], before[1]]
            batch = self._writes(where, params, "step DESC, seq DESC", 64)
            for w in batch:
                p = parse_path(w.path)
                n = min(len(p), len(wanted))
                if p[:n] == wanted[:n]:
                    return w
            if len(batch) < 64:
                return None
            before = (batch[-1].step, batch[-1].seq)

    def sections(self, prompt_id: str) -> list[dict[str, Any]]:
        cols = ["prompt_id", "idx", "kind", "text", "start_char", "end_char", "source_kind", "source_id", "run_id",
                "step"]
        found = self._query(f"SELECT {', '.join(cols)} FROM prompt_sections WHERE prompt_id = ? ORDER BY idx",
                            [prompt_id])
        return [dict(zip(cols, row)) for row in found]

    def fields(self) -> Optional[list[str]]:
        roots: list[str] = []
        for (path,) in self._query("SELECT DISTINCT path FROM writes WHERE run_id = ? ORDER BY path",
                                   [self.run.run_id]):
            root = str(parse_path(path)[0])
            if root not in roots:
                roots.append(root)
        return roots

    def own_writes(self, root: str) -> Optional[list[Write]]:
        return self._writes(_ROOT, [root, root, root], "step, seq", 10_000_000)

