"""Where streamres' events go: structlog when the application configured it, else the standard
library's ``logging`` (silent until the application configures it), never to stdout.

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

from streamres._core.redact import Redactor

__all__ = ["log", "mask_http_logs"]

_std = logging.getLogger("streamres")
# The library convention: an application that configured no logging sees nothing of the
# library's (without a handler, Python's last resort would print WARNING records on stderr,
# beside the exception the caller already gets). One that configured logging gets them all.
_std.addHandler(logging.NullHandler())
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

#: The HTTP stack's own loggers. Their DEBUG records print response headers, which a server
#: may use to echo the key it was sent.
_HTTP_LOGGERS = (
    "httpx",
    "httpcore.connection",
    "httpcore.http11",
    "httpcore.http2",
    "httpcore.proxy",
    "httpcore.socks",
)


class _Masking(logging.Filter):
    """Masks the secrets streamres sends in httpx's and httpcore's records. It runs only for
    records those loggers make, which they make only when the application enabled them."""

    def __init__(self) -> None:
        super().__init__()
        self.secrets: frozenset[str] = frozenset()
        self.redactor: Redactor | None = None

    def add(self, secrets: frozenset[str]) -> None:
        if not secrets <= self.secrets:
            self.secrets |= secrets
            self.redactor = Redactor(self.secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        if self.redactor is not None:
            message = record.getMessage()
            masked = self.redactor.redact(message)
            if masked != message:
                record.msg, record.args = masked, ()
        return True


_masking = _Masking()
for _name in _HTTP_LOGGERS:
    logging.getLogger(_name).addFilter(_masking)


def mask_http_logs(secrets: frozenset[str]) -> None:
    """Mask ``secrets`` (keys, URL credentials, secret headers) in the HTTP stack's logs."""
    _masking.add(secrets)
