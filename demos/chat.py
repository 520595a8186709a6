"""The terminal chat, runnable from a clone: ``python demos/chat.py`` (same as ``streamres chat``).

The app itself is ``streamres/chat/``: it uses only the public API and is the example UI
integration (events in, text and one status line out).
"""

from __future__ import annotations

import logging
import sys

import structlog

from streamres.chat import main


def _quiet_logs() -> None:
    # The chat shows failures itself; library logs go to stderr, errors only.
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )


if __name__ == "__main__":
    sys.exit(main(configure=_quiet_logs))
