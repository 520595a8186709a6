"""What the apps built on the library take from it beyond its public API, in one place.

The terminal chat (``streamres.chat``), the proxy (``streamres.proxy``) and the command line
(``streamres._apps``) use ``streamres``'s public names and these; they reach no deeper
(``tests/faces/test_layers.py`` holds them to it). Each name is documented where it is
defined; this module only gathers them.
"""

from __future__ import annotations

from streamres._answer.options import KNOWN_ARGUMENTS
from streamres._core.bounds import ANSWER
from streamres._core.lanes import BACKGROUND, NORMAL, parse_priority
from streamres._core.redact import redact_url
from streamres._core.stall import FIRST_OUTPUT, HEADERS, QUICK_FIRST, model_reasons
from streamres._core.wording import plural
from streamres._providers.fields import markdown as fields_markdown
from streamres._providers.params import for_route
from streamres._providers.tools import flat_name
from streamres._shell.cliargs import (
    DEFAULT_MODELS,
    Parser,
    add_target_arguments,
    offline_refusal,
    port,
    positive_int,
    positive_seconds,
    real_target,
    seconds_or_zero,
)
from streamres._shell.extras import install_hint, installed, require
from streamres._shell.log import log
from streamres._shell.shared import SharedState
from streamres._shell.stream import load_counter
from streamres._shell.tracing import otel_installed

__all__ = [
    "ANSWER",
    "BACKGROUND",
    "DEFAULT_MODELS",
    "FIRST_OUTPUT",
    "HEADERS",
    "KNOWN_ARGUMENTS",
    "NORMAL",
    "QUICK_FIRST",
    "Parser",
    "SharedState",
    "add_target_arguments",
    "fields_markdown",
    "flat_name",
    "for_route",
    "install_hint",
    "installed",
    "load_counter",
    "log",
    "model_reasons",
    "offline_refusal",
    "otel_installed",
    "parse_priority",
    "plural",
    "port",
    "positive_int",
    "positive_seconds",
    "real_target",
    "redact_url",
    "require",
    "seconds_or_zero",
]
