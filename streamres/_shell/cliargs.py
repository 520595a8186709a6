"""The command line's one room for what its commands share: a parser whose bad values are
answered in one line (exit 2), not a usage dump, and whose help shows each default; the number
types; and where answers come from — a real service named by flags or the environment, or the
embedded upstream (``add_target_arguments``, ``real_target``, ``offline_refusal``). Each
command declares its own options where it lives (``_apps/cli.py``, ``_apps/batch_cli.py``, the
chat's ``parser``); the apps reach this room through ``_shell/apps``."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any, Literal, NoReturn

__all__ = [
    "DEFAULT_MODELS",
    "Parser",
    "add_target_arguments",
    "offline_refusal",
    "port",
    "positive_int",
    "positive_seconds",
    "real_target",
    "seconds_or_zero",
]

#: The model asked of a real service when none is named.
DEFAULT_MODELS = {"openai": "gpt-4o-mini", "anthropic": "claude-sonnet-4-5"}


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


def real_target(
    args: argparse.Namespace,
) -> tuple[Literal["openai", "anthropic"], str | None, str | None] | None:
    """``(provider, base_url, api_key)`` of the real service the flags or the environment
    point at, or ``None`` for the embedded upstream (also used by ``streamres ask``)."""
    if args.embedded:
        return None
    if args.base_url or args.api_key:
        return (args.provider or "openai", args.base_url, args.api_key)
    if args.provider in (None, "openai") and (
        os.environ.get("OPENAI_API_KEY") or os.environ.get("OPENAI_BASE_URL")
    ):
        return ("openai", None, None)
    if args.provider in (None, "anthropic") and os.environ.get("ANTHROPIC_API_KEY"):
        return ("anthropic", None, None)
    return None


def offline_refusal(args: argparse.Namespace) -> str | None:
    """Why the offline demo must not answer these flags, or ``None``: a model or provider named
    without a key or base URL is a person expecting that service, and the embedded upstream's
    canned answers must never pass for it. ``--embedded`` (or a ``demo-*`` name) asks the demo
    on purpose."""
    if args.embedded or real_target(args) is not None:
        return None
    named = [m for m in args.model or () if not m.startswith("demo-")]
    if not named and args.provider is None:
        return None
    what = f"model {named[0]}" if named else f"provider {args.provider}"
    # A Claude model named without a provider is Anthropic's: its key is the one to set.
    claude = args.provider is None and bool(named) and named[0].lower().startswith("claude")
    key = "ANTHROPIC_API_KEY" if args.provider == "anthropic" or claude else "OPENAI_API_KEY"
    return (
        f"{what} is a real service and no key or base URL is set: set {key} (or pass "
        "--api-key / --base-url); add --embedded to ask the offline demo upstream instead "
        "(canned answers, not a real model)"
    )


def add_target_arguments(p: argparse.ArgumentParser, *, token_delay: float) -> None:
    """Where answers come from: a real service, or the embedded upstream and its faults."""
    p.add_argument(
        "--provider",
        choices=["openai", "anthropic"],
        help="API of the real service (default: openai, or anthropic with only ANTHROPIC_API_KEY)",
    )
    p.add_argument("--base-url", help="a real server's URL (default: $OPENAI_BASE_URL)")
    p.add_argument("--api-key", help="its key (default: $OPENAI_API_KEY / $ANTHROPIC_API_KEY)")
    p.add_argument(
        "--model",
        action="append",
        help="model name; repeat for a fallback chain (embedded default: demo-large)",
    )
    p.add_argument(
        "--embedded",
        action="store_true",
        help="the offline embedded upstream, even if keys are set or --model names a real model",
    )
    p.add_argument(
        "--faults",
        default="storm",
        help="embedded upstream faults: none, light, storm, or a plan such as 529,reset@40",
    )
    p.add_argument(
        "--token-delay",
        type=seconds_or_zero,
        default=token_delay,
        help="embedded upstream seconds per token",
    )
    p.add_argument(
        "--words", type=positive_int, default=120, help="embedded upstream answer length"
    )
    p.add_argument(
        "--deadline",
        type=positive_seconds,
        default=120.0,
        help="seconds for the whole answer, retries and resumes included",
    )
