"""How the core says what happened: through a logger its shell hands it. Pure.

The core performs no I/O, and writing a log line is I/O (structlog, or the standard library's
handlers): so the machine holds a :class:`Log` it was given — the shell's, which sends events to
structlog or ``logging`` (``_shell/log``) — and, given none, one that says nothing (the
socket-free tests run so).
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["SILENT", "Log"]


class Log(Protocol):
    """Events with a dotted name and flat keys, at three levels."""

    def debug(self, event: str, **kw: Any) -> None: ...

    def info(self, event: str, **kw: Any) -> None: ...

    def warning(self, event: str, **kw: Any) -> None: ...


class _Silent:
    def debug(self, event: str, **kw: Any) -> None:
        pass

    def info(self, event: str, **kw: Any) -> None:
        pass

    def warning(self, event: str, **kw: Any) -> None:
        pass


#: The logger of a core given none: it says nothing.
SILENT: Log = _Silent()
