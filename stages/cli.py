"""The installed `tracemem` command: the engine's CLI plus `demo`, which is built from these stages."""
from __future__ import annotations

import argparse
from typing import Any, Optional, Sequence

from tracemem.cli import main as engine_main


def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--fresh", action="store_true", help="start from an empty file")


def _demo(args: argparse.Namespace, out: Any) -> None:
    from .demo import run_demo

    run_demo(getattr(args, "db", None) or "demo.duckdb", fresh=args.fresh, out=out)


def main(argv: Optional[Sequence[str]] = None, out: Any = None) -> int:
    """`tracemem …`: every engine command, and `demo`."""
    return engine_main(argv, out, extra={"demo": ("the whole idea in one minute", _demo_arguments, _demo)})


if __name__ == "__main__":
    raise SystemExit(main())
