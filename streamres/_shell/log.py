"""Where streamres' events go: structlog when the application configured it, else the standard
library's ``logging`` (silent below WARNING by default), never straight to stdout.

structlog, unconfigured, prints every event to stdout — into the very terminal or pipe a chat
UI writes its answer to. A library must not configure logging for its application, so instead
it looks: with structlog configured (``structlog.configure(...)``, or
``structlog.testing.capture_logs()``), events are structlog events with dotted names and flat
keys; without, they go to ``logging.getLogger("streamres")`` as ``event key=value …``.
"""

from __future__ import annotations

import logging
from typing import Any

import structlog

__all__ = ["log"]

_std = logging.getLogger("streamres")
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}


class _Log:
    def _emit(self, level: str, event: str, kw: dict[str, Any]) -> None:
        if structlog.is_configured():
            getattr(structlog.get_logger("streamres"), level)(event, **kw)
        elif _std.isEnabledFor(_LEVELS[level]):
            _std.log(_LEVELS[level], "%s %s", event, " ".join(f"{k}={v!r}" for k, v in kw.items()))

    def debug(self, event: str, **kw: Any) -> None:
        self._emit("debug", event, kw)

    def info(self, event: str, **kw: Any) -> None:
        self._emit("info", event, kw)

    def warning(self, event: str, **kw: Any) -> None:
        self._emit("warning", event, kw)


log = _Log()
