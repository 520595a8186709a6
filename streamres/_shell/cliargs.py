"""Command-line parsing shared by ``streamres ask``, ``serve`` and ``chat``: every option with
its help and default, and a bad value answered in one line (exit 2), not a usage dump."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, NoReturn

__all__ = ["Parser", "port", "positive_int", "positive_seconds", "seconds_or_zero"]


class _Defaults(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each default once: a help text that already says its default keeps its own words
    (``default: from the locale``), not argparse's too."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.help and "(default:" in action.help:
            return action.help
        if action.default is None or action.default is False:
            return action.help  # nothing to say: the option is off unless given
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose help shows defaults and whose errors are one line."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Defaults)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def _number(kind: Callable[[str], Any], *, low: float, strict: bool, what: str) -> Any:
    """An argparse type: a number above ``low`` (or at least ``low``), refused plainly."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if value != value or (value <= low if strict else value < low) or value == float("inf"):
            raise argparse.ArgumentTypeError(f"{text} is not {what}")
        return value

    parse.__name__ = what  # argparse names the type in its messages
    return parse


positive_seconds = _number(float, low=0, strict=True, what="a positive number of seconds")
seconds_or_zero = _number(float, low=0, strict=False, what="a number of seconds >= 0")
positive_int = _number(int, low=0, strict=True, what="a positive integer")
_port = _number(int, low=0, strict=False, what="a port number (0-65535; 0 picks a free one)")


def port(text: str) -> int:
    value: int = _port(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{text} is not a port number (0-65535)")
    return value
