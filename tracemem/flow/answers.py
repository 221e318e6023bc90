"""What a pause expects back: the `expect=` of `ctx.interrupt` and of `pause_before` points.

A human's answer crosses a boundary (a CLI, a web form, another process), so a typo
is likely, and it must never cost the run. A pause names the type its answer must
have (a pydantic model, a dataclass, a TypedDict or a plain type such as `bool`); the
type is recorded by its import path with the pause (`runs.resume_at["expect"]`), so a
resume in any process validates the answer with pydantic *before* it claims the run
or commits anything. A bad answer raises `AnswerError` naming the field and what was
wrong, and the run stays paused: resuming it again with a valid answer continues it.
The stage that asked then gets the validated value (a model instance, not a dict).

Validation gets the pause's payload as pydantic context (`info.context["asked"]`),
so a model validator can check an answer against what was asked (the tool approval
answer checks that it decides every call that was asked about).
"""
from __future__ import annotations

import importlib
from typing import Any, Optional

from pydantic import TypeAdapter, ValidationError

from ..errors import AnswerError, TracememError

__all__ = ["expect_ref", "load_expect", "check_answer"]


def expect_ref(expect: Any) -> Optional[str]:
    """`module:qualname` of an expected answer type, checked to import back (a resume in another process
    imports it); None for None."""
    if expect is None:
        return None
    module, qualname = getattr(expect, "__module__", None), getattr(expect, "__qualname__", None)
    if not isinstance(expect, type) or not module or not qualname or "<locals>" in qualname:
        raise TracememError(f"expect={expect!r} must be a class importable by module and name (a pydantic model, "
                            f"a dataclass, a TypedDict, or bool/int/str/float/dict/list), so that a resume in "
                            f"another process can check answers: define it at module level")
    ref = f"{module}:{qualname}"
    if load_expect(ref) is not expect:
        raise TracememError(f"expect={qualname} cannot be imported back as {ref}: define it at module level")
    return ref


def load_expect(ref: str, home: Optional[str] = None) -> type:
    """The type an `expect_ref` names. `home` is the module of the stage that asked: where a type recorded
    in a script's `__main__` is found when another program (the CLI, a worker) loaded that script."""
    module, _, qualname = ref.partition(":")
    error: Optional[Exception] = None
    for name in dict.fromkeys([module] + ([home] if home and module == "__main__" else [])):
        try:
            target: Any = importlib.import_module(name)
            for part in qualname.split("."):
                target = getattr(target, part)
            return target
        except (ImportError, AttributeError) as err:
            error = err
    raise TracememError(f"the pause expects an answer of type {ref}, which cannot be imported here ({error}); "
                        f"resume it where the flow's code is importable") from None


def check_answer(expect: Any, answer: Any, asked: Any, where: str, home: Optional[str] = None) -> Any:
    """`answer` validated as `expect` (a type, or an `expect_ref`), with the question `asked` as context;
    `AnswerError` saying what is wrong, naming `where` (the run and stage), when it does not fit."""
    kind = load_expect(expect, home) if isinstance(expect, str) else expect
    try:
        return TypeAdapter(kind).validate_python(answer, context={"asked": asked})
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(the answer)'}: {e['msg']}"
                             for e in err.errors()[:5])
        raise AnswerError(f"{where} expects an answer of type {getattr(kind, '__name__', kind)}, and {answer!r:.120} "
                          f"does not fit ({problems}); nothing was changed and the run is still paused: resume it "
                          f"again with a valid answer") from None
