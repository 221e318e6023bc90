"""Loading code named on the command line: `MODULE:ATTR` or `path/to/file.py:ATTR`.

The store holds runs, not code, so the commands that run a flow again (`graph`,
`resume`, `fork`, `counterfactual`) name it, and the clients its stages need
(`--env`), this way. One loader, so every command accepts the same forms.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from typing import Any, Optional

from ..errors import TracememError


def load_attr(target: str, what: str) -> Any:
    """The object `MODULE:ATTR` (or `FILE.py:ATTR`) names; `what` is the option, for the error."""
    where, _, attr = target.rpartition(":")
    if not where or not attr:
        raise TracememError(f"{what} takes MODULE:ATTR or FILE.py:ATTR (e.g. examples.credit:flow), got {target!r}")
    try:
        if where.endswith(".py"):
            spec = importlib.util.spec_from_file_location(f"tracemem_cli_{abs(hash(where))}", where)
            if spec is None or spec.loader is None or not os.path.exists(where):
                raise ImportError(f"no file {where}")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            if os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(where)
    except ImportError as err:
        raise TracememError(f"cannot import {where}: {err}") from None
    except Exception as err:  # the module itself failed (syntax error, an exception at import)
        raise TracememError(f"cannot import {where}: {type(err).__name__}: {err}") from None
    if not hasattr(module, attr):
        raise TracememError(f"{where} has no attribute '{attr}'")
    return getattr(module, attr)


def load_flow(target: str, what: str = "the flow") -> Any:
    """The Flow `target` names: a Flow, a Pipeline (built here), or a function of no arguments returning either."""
    from ..flow.pipeline import Flow, Pipeline

    flow = load_attr(target, what)
    if callable(flow) and not isinstance(flow, (Flow, Pipeline, type)):
        required = [p.name for p in inspect.signature(flow).parameters.values()
                    if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        if required:
            raise TracememError(f"{target} takes arguments ({', '.join(required)}); a factory is called with "
                                f"none: name a function that builds the flow on its own")
        try:
            flow = flow()
        except Exception as err:
            raise TracememError(f"{target}() failed: {type(err).__name__}: {err}") from None
    if isinstance(flow, Pipeline):
        flow = flow.build()
    if not isinstance(flow, Flow):
        raise TracememError(f"{target} is (or returned) a {type(flow).__name__}, not a flow: name a Pipeline, "
                            f"a built Flow or a function returning one")
    return flow


def load_env(target: Optional[str]) -> Optional[dict[str, Any]]:
    """The env `--env MODULE:ATTR` names: a dict, or a function returning one (None without --env)."""
    if not target:
        return None
    env = load_attr(target, "--env")
    if callable(env):
        env = env()
    if not isinstance(env, dict):
        raise TracememError(f"--env {target} gave a {type(env).__name__}, not a dict")
    return env
