"""Shared state on Redis, one view for many processes. I/O shell.

``state`` starts the parts together (its docstring is the whole story): ``leases``
(concurrency slots and the fleet's epoch), ``broadcast`` (breaker openings, cool-downs, the
one probe), ``budget`` (the retry budget), ``metrics`` (weights and figures), all over
``connection`` (every call bounded, local mode while Redis is away); ``cache`` is the answer
cache shared between them. Their Lua scripts are ``scripts/*.lua``, loaded by name.
"""

from streamres._shell.shared.state import LEASE, SharedState, SharedStatus

__all__ = ["LEASE", "SharedState", "SharedStatus"]
