"""``streamres bench``: the benchmarks, one module each, and the table that dispatches to them.

Each measures what a user sees (real framing, cold and warm, ratios to a baseline measured in
the same run); none is imported by the library. ``streamres bench NAME --help`` says what each
takes; ``streamres bench`` alone runs the default suite (``suite``).
"""

from __future__ import annotations

import importlib
import sys

__all__ = ["BENCHMARKS", "main"]

#: ``streamres bench NAME``: the module that runs it (its ``main(argv)``).
BENCHMARKS: dict[str, str] = {
    "proxy": "proxy",
    "warning": "warning",
    "load": "load",
    "--load": "load",
    "abuse": "abuse",
    "batch": "batch",
    "continuation": "continuation",
    "resume": "resume",
    "held": "held",
    "replicas": "replicas",
    "--continuation": "continuation",
}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark ``argv`` names (the default suite when it names none)."""
    given = argv if argv is not None else sys.argv[1:]
    name = BENCHMARKS.get(given[0]) if given else None
    module = importlib.import_module(f"streamres.benchmarks.{name or 'suite'}")
    run: int = module.main(given[1:] if name else given)
    return run
