"""Arguments of one answer, validated before any request is made.

Bad input raises :class:`~streamres.InvalidRequest` at once, saying what is wrong and what to do.
"""

from __future__ import annotations

import difflib
import os
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from streamres._core.backoff import Backoff
from streamres._core.bounds import ReadLimits
from streamres._core.errors import InvalidRequest
from streamres._core.lanes import NORMAL, check_priority
from streamres._core.redact import redact_url
from streamres._core.stall import FIRST_OUTPUT, HEADERS, QUICK_FIRST, model_reasons
from streamres._core.trickle import PaceFloor
from streamres._fleet.balance import RetryBudget
from streamres._fleet.fleet import Fleet
from streamres._fleet.routes import Route
from streamres._providers.params import for_route

__all__ = [
    "KNOWN_ARGUMENTS",
    "Options",
    "check_client_routes",
    "check_headers",
    "check_more",
    "check_options",
    "resolve_route",
    "single_call_routes",
]

_DEFAULTS = {
    "openai": ("OPENAI_BASE_URL", "https://api.openai.com/v1", "OPENAI_API_KEY"),
    "openai-responses": ("OPENAI_BASE_URL", "https://api.openai.com/v1", "OPENAI_API_KEY"),
    "anthropic": ("ANTHROPIC_BASE_URL", "https://api.anthropic.com", "ANTHROPIC_API_KEY"),
}
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
_RESERVED = frozenset(
    {"model", "messages", "stream", "max_tokens", "max_completion_tokens", "max_output_tokens"}
)


def _bad(what: str) -> InvalidRequest:
    return InvalidRequest(what, reason="invalid")


@dataclass(frozen=True, slots=True)
class Options:
    """Everything one answer needs, checked. ``chain`` indexes ``fleet.routes``."""

    messages: list[dict[str, Any]]
    fleet: Fleet
    chain: tuple[int, ...]
    deadline: float
    #: The caller's fixed stall limit, or ``None`` for the adaptive one (``_stall``).
    stall_timeout: float | None
    first_token_timeout: float
    max_tokens: int | None
    max_attempts: int | None
    backoff: Backoff
    fallback_after: int
    headers: dict[str, str]
    extra_body: dict[str, Any]
    rng: random.Random = field(default_factory=random.Random)
    read_limits: ReadLimits = field(default_factory=ReadLimits)
    #: Its lane when slots are full (``_core/lanes``): higher goes first.
    priority: int = 0
    #: Seconds to wait for response headers when the chain has another model (``HEADERS``).
    header_timeout: float = HEADERS
    #: The first-output wait of a quick request (no reasoning asked) on a model with no
    #: history, when the chain has another model (``stall.QUICK_FIRST``).
    quick_first_token_timeout: float = QUICK_FIRST
    #: The caller's words asking an instruct continuation to go on (``None``: the route's,
    #: else streamres's own in the answer's language).
    continue_instruction: str | None = None
    #: How slow a stream that still produces may be before the answer moves on (opt-in).
    pace_floor: PaceFloor | None = None
    #: Text the caller already has (``continue_from``): the answer starts as though it had
    #: been delivered, and its first request asks for the rest.
    continue_from: str = ""
    #: A hedge covers the first model's slow first output (``_shell/hedge``): its attempts
    #: wait the whole ``first_token_timeout``, not the limit learnt from its history (at which
    #: the hedge starts the fallback alongside instead of leaving it).
    hedged: bool = False


def _instruction(value: Any) -> str | None:
    """A caller's continue instruction: ``None``, or words to send."""
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise _bad(f"continue_instruction must be None or some words, not {value!r:.60}")
    return value


def resolve_route(route: Route) -> Route:
    """Fill a route's base URL and key from the environment, and check them."""
    if not isinstance(route, Route):
        raise _bad(f"routes must be streamres.Route(...) objects, not {route!r:.60}")
    if route.provider not in _DEFAULTS:
        raise _bad(
            f"provider must be 'openai', 'anthropic' or 'openai-responses', not {route.provider!r}"
        )
    if not isinstance(route.model, str) or not route.model:
        raise _bad(f"a model name must be a non-empty string, not {route.model!r}")
    if route.api_key is not None and not isinstance(route.api_key, str):
        raise _bad(f"api_key must be a string, not a {type(route.api_key).__name__}")
    if route.base_url is not None and not isinstance(route.base_url, str):
        raise _bad(f"base_url must be a string, not {route.base_url!r:.60}")
    if isinstance(route.weight, bool) or not isinstance(route.weight, (int, float)):
        raise _bad(f"weight must be a positive number, not {route.weight!r}")
    if route.max_in_flight is not None and (
        isinstance(route.max_in_flight, bool) or not isinstance(route.max_in_flight, int)
    ):
        raise _bad(f"max_in_flight must be None or a positive integer, not {route.max_in_flight!r}")
    env_url, official, env_key = _DEFAULTS[route.provider]
    url = route.base_url or os.environ.get(env_url) or official
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        shown = redact_url(url) if isinstance(url, str) else url
        raise _bad(f"base_url must be an http:// or https:// URL, not {shown!r}")
    key = route.api_key if route.api_key is not None else os.environ.get(env_key)
    if not key and url == official:
        raise _bad(f"no API key for {official}: pass api_key=... or set {env_key}")
    if route.continuation not in ("auto", "prefill", "prefix", "partial", "instruct"):
        raise _bad("continuation must be 'auto', 'prefill', 'prefix', 'partial' or 'instruct'")
    _instruction(route.continue_instruction)
    if not isinstance(route.replay, bool):
        raise _bad(f"replay must be True or False, not {route.replay!r:.60}")
    if route.max_in_flight is not None and route.max_in_flight < 1:
        raise _bad(f"max_in_flight must be None or a positive integer, not {route.max_in_flight}")
    if not route.weight > 0:
        raise _bad(f"weight must be positive, not {route.weight!r}")
    if route.header_timeout is not None:
        _seconds("header_timeout", route.header_timeout)
    if route.first_token_timeout is not None:
        _seconds("first_token_timeout", route.first_token_timeout)
    if route.thinks is not None and not isinstance(route.thinks, bool):
        raise _bad(f"thinks must be True, False or None, not {route.thinks!r:.60}")
    return replace(route, base_url=url, api_key=key)


#: Every keyword streamres itself takes; an unknown keyword close to one of these is a typo.
KNOWN_ARGUMENTS = (
    "messages",
    "model",
    "base_url",
    "api_key",
    "provider",
    "deadline",
    "stall_timeout",
    "first_token_timeout",
    "quick_first_token_timeout",
    "continue_instruction",
    "pace_floor",
    "header_timeout",
    "max_tokens",
    "client",
    "continuation",
    "replay",
    "max_attempts",
    "backoff",
    "fallback_after",
    "headers",
    "rng",
    "read_limits",
    "fallback",
)


def _seconds(name: str, value: Any, *, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        what = (
            "None or a positive number of seconds" if optional else "a positive number of seconds"
        )
        raise _bad(f"{name} must be {what}, not {value!r}")
    if value != value or value == float("inf"):
        raise _bad(f"{name} must be a finite number of seconds, not {value!r}")
    return float(value)


def check_headers(headers: Any) -> dict[str, str]:
    """Extra request headers: a mapping of strings to strings."""
    if headers is None:
        return {}
    if not isinstance(headers, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise _bad(f"headers must be a dict of strings to strings, not {headers!r:.80}")
    return dict(headers)


def check_more(more: Mapping[str, Any]) -> dict[str, Any]:
    """Extra body fields: refused when streamres sets them, or when they look like a misspelt
    streamres argument (``deadlne=5`` would otherwise go silently into the request body)."""
    reserved = _RESERVED & more.keys()
    if reserved:
        raise _bad(f"{sorted(reserved)} are set by streamres; use model=/max_tokens= instead")
    for key in more:
        close = difflib.get_close_matches(key, KNOWN_ARGUMENTS, n=1, cutoff=0.85)
        if close:
            raise _bad(
                f"unknown argument {key}=: did you mean {close[0]}=? (Other extra arguments go "
                "into the request body as they are.)"
            )
    n = more.get("n")
    if n is not None and n != 1:
        raise _bad(
            f"n={n!r}: streamres streams one answer (choice) per call; make {n} calls instead"
        )
    return dict(more)


def check_options(
    messages: Any,
    *,
    fleet: Fleet,
    chain: Sequence[int],
    deadline: Any,
    stall_timeout: Any,
    max_tokens: Any,
    max_attempts: Any,
    backoff: Any,
    fallback_after: Any,
    headers: Any,
    more: dict[str, Any],
    rng: Any,
    read_limits: Any = None,
    first_token_timeout: Any = FIRST_OUTPUT,
    priority: Any = NORMAL,
    header_timeout: Any = HEADERS,
    continue_from: Any = "",
    quick_first_token_timeout: Any = QUICK_FIRST,
    continue_instruction: Any = None,
    pace_floor: Any = None,
) -> Options:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise _bad("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    checked: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
            raise _bad(f"messages[{i}] must be a dict with 'role' and 'content'; got {m!r:.80}")
        if m["role"] not in _ROLES:
            raise _bad(f"messages[{i}] has role {m['role']!r}; expected one of {sorted(_ROLES)}")
        if not isinstance(m["content"], (str, list)) and not (
            m["content"] is None and m.get("tool_calls")
        ):
            raise _bad(f"messages[{i}]['content'] must be a string or a list of content parts")
        checked.append(dict(m))
    for name, value in (("max_tokens", max_tokens), ("max_attempts", max_attempts)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise _bad(f"{name} must be None or a positive integer, not {value!r}")
    if (
        isinstance(fallback_after, bool)
        or not isinstance(fallback_after, int)
        or fallback_after < 1
    ):
        raise _bad(f"fallback_after must be a positive integer, not {fallback_after!r}")
    if backoff is not None and not isinstance(backoff, Backoff):
        raise _bad(f"backoff must be a streamres.Backoff(...), not {backoff!r:.60}")
    if rng is not None and not isinstance(rng, random.Random):
        raise _bad(f"rng must be a random.Random, not {rng!r:.60}")
    if pace_floor is not None and not isinstance(pace_floor, PaceFloor):
        raise _bad(f"pace_floor must be a streamres.PaceFloor(...), not {pace_floor!r:.60}")
    if read_limits is not None and not isinstance(read_limits, ReadLimits):
        raise _bad(f"read_limits must be a streamres.ReadLimits(...), not {read_limits!r:.60}")
    if not isinstance(continue_from, str):
        raise _bad(f"continue_from must be a string, not {continue_from!r:.60}")
    if continue_from and (
        checked[-1]["role"] == "assistant" or not any(m["role"] == "user" for m in checked)
    ):
        raise _bad(
            "continue_from continues an answer to the messages: they must end with the "
            "user's turn, not an assistant message"
        )
    extra = check_more(more)
    for i in dict.fromkeys(chain):  # refused before any request, not when a fallback comes
        route = fleet.routes[i]
        try:
            for_route(route.provider, extra, reasons=model_reasons(route.model, route.thinks))
        except ValueError as exc:
            where = f"route {route.key!r}, {route.provider}, is in this answer's chain"
            raise _bad(f"{exc} ({where})") from None
    return Options(
        messages=checked,
        fleet=fleet,
        chain=tuple(chain),
        deadline=_seconds("deadline", deadline) or 0.0,
        stall_timeout=_seconds("stall_timeout", stall_timeout, optional=True),
        first_token_timeout=_seconds("first_token_timeout", first_token_timeout) or 0.0,
        max_tokens=max_tokens,
        max_attempts=max_attempts,
        backoff=backoff or Backoff(),
        fallback_after=fallback_after,
        headers=check_headers(headers),
        extra_body=extra,
        rng=rng or random.Random(),
        read_limits=read_limits or ReadLimits(),
        priority=_priority(priority),
        header_timeout=_seconds("header_timeout", header_timeout) or HEADERS,
        continue_from=continue_from,
        quick_first_token_timeout=(
            _seconds("quick_first_token_timeout", quick_first_token_timeout) or QUICK_FIRST
        ),
        continue_instruction=_instruction(continue_instruction),
        pace_floor=pace_floor,
    )


def _priority(value: Any) -> int:
    try:
        return check_priority(value)
    except ValueError as exc:
        raise _bad(str(exc)) from None


def single_call_routes(
    model: Any,
    provider: Any,
    base_url: str | None,
    api_key: str | None,
    continuation: Any,
    replay: Any = True,
) -> list[Route]:
    """The routes of one ``stream_resilient()`` call: ``model`` is a name or a fallback chain
    of names on the same server."""
    names = (
        (model,) if isinstance(model, str) else tuple(model) if isinstance(model, Sequence) else ()
    )
    if not names or not all(isinstance(m, str) and m for m in names):
        raise InvalidRequest(
            f"model must be a model name or a non-empty sequence of model names, not {model!r:.60}",
            reason="invalid",
        )
    return [
        resolve_route(
            Route(
                m,
                provider=provider,
                base_url=base_url,
                api_key=api_key,
                name=f"{m}#{i}",
                continuation=continuation,
                replay=replay,
            )
        )
        for i, m in enumerate(names)
    ]


def check_client_routes(
    routes: Any,
    account_limits: Any,
    retry_budget: Any,
    breaker_threshold: Any,
    breaker_recovery: Any,
) -> list[Route]:
    """A ``Client``'s routes (resolved) and shared-state arguments, checked."""
    if isinstance(routes, (str, bytes)) or not isinstance(routes, Sequence) or not routes:
        raise InvalidRequest(
            "a Client needs a non-empty list of streamres.Route(...)", reason="invalid"
        )
    if retry_budget is not None and not isinstance(retry_budget, RetryBudget):
        raise InvalidRequest(
            f"retry_budget must be a streamres.RetryBudget(...), not {retry_budget!r:.60}",
            reason="invalid",
        )
    limits = account_limits or {}
    if not isinstance(limits, Mapping) or not all(
        isinstance(k, str) and type(v) is int and v >= 1 for k, v in limits.items()
    ):
        raise InvalidRequest(
            "account_limits must map account names (base URLs) to positive integers, not "
            f"{account_limits!r:.80}",
            reason="invalid",
        )
    resolved = [resolve_route(r) for r in routes]
    keys = [r.key for r in resolved]
    if len(set(keys)) != len(keys):
        raise InvalidRequest(
            f"route names must be unique ({keys}); give duplicates a name=", reason="invalid"
        )
    if (
        type(breaker_threshold) is not int
        or breaker_threshold < 1
        or isinstance(breaker_recovery, bool)
        or not isinstance(breaker_recovery, (int, float))
        or breaker_recovery < 0
    ):
        raise InvalidRequest(
            "breaker_threshold must be >= 1 and breaker_recovery >= 0", reason="invalid"
        )
    return resolved
