"""Shared state on Redis: concurrency slots, breaker openings, the retry budget, weights and
metrics, one view for many processes (``state``), and the answer cache shared between them
(``cache``); their Lua scripts in ``scripts/``."""

from streamres._shell.shared.state import LEASE, SharedState, SharedStatus

__all__ = ["LEASE", "SharedState", "SharedStatus"]
