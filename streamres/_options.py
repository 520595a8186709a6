"""Arguments of one answer, validated before any request is made.

Bad input raises :class:`~streamres.InvalidRequest` at once, saying what is wrong and what to do.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ._backoff import Backoff
from ._bounds import ReadLimits
from ._errors import InvalidRequest
from ._fleet import Fleet
from ._redact import redact_url
from ._routes import Route

__all__ = ["Options", "check_options", "resolve_route"]

_DEFAULTS = {
    "openai": ("OPENAI_BASE_URL", "https://api.openai.com/v1", "OPENAI_API_KEY"),
    "openai-responses": ("OPENAI_BASE_URL", "https://api.openai.com/v1", "OPENAI_API_KEY"),
    "anthropic": ("ANTHROPIC_BASE_URL", "https://api.anthropic.com", "ANTHROPIC_API_KEY"),
}
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
_RESERVED = frozenset({"model", "messages", "stream", "max_tokens", "max_completion_tokens"})


def _bad(what: str) -> InvalidRequest:
    return InvalidRequest(what, reason="invalid")


@dataclass(frozen=True, slots=True)
class Options:
    """Everything one answer needs, checked. ``chain`` indexes ``fleet.routes``."""

    messages: list[dict[str, Any]]
    fleet: Fleet
    chain: tuple[int, ...]
    deadline: float
    stall_timeout: float
    max_tokens: int | None
    max_attempts: int | None
    backoff: Backoff
    fallback_after: int
    headers: dict[str, str]
    extra_body: dict[str, Any]
    rng: random.Random = field(default_factory=random.Random)
    read_limits: ReadLimits = field(default_factory=ReadLimits)


def resolve_route(route: Route) -> Route:
    """Fill a route's base URL and key from the environment, and check them."""
    if route.provider not in _DEFAULTS:
        raise _bad(
            f"provider must be 'openai', 'anthropic' or 'openai-responses', not {route.provider!r}"
        )
    if not isinstance(route.model, str) or not route.model:
        raise _bad(f"a model name must be a non-empty string, not {route.model!r}")
    env_url, official, env_key = _DEFAULTS[route.provider]
    url = route.base_url or os.environ.get(env_url) or official
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        shown = redact_url(url) if isinstance(url, str) else url
        raise _bad(f"base_url must be an http:// or https:// URL, not {shown!r}")
    key = route.api_key if route.api_key is not None else os.environ.get(env_key)
    if not key and url == official:
        raise _bad(f"no API key for {official}: pass api_key=... or set {env_key}")
    if route.continuation not in ("auto", "prefill", "prefix", "instruct"):
        raise _bad("continuation must be 'auto', 'prefill', 'prefix' or 'instruct'")
    if route.max_in_flight is not None and route.max_in_flight < 1:
        raise _bad(f"max_in_flight must be None or a positive integer, not {route.max_in_flight}")
    if not route.weight > 0:
        raise _bad(f"weight must be positive, not {route.weight!r}")
    return replace(route, base_url=url, api_key=key)


def check_options(
    messages: Any,
    *,
    fleet: Fleet,
    chain: Sequence[int],
    deadline: Any,
    stall_timeout: Any,
    max_tokens: Any,
    max_attempts: Any,
    backoff: Backoff | None,
    fallback_after: Any,
    headers: Mapping[str, str] | None,
    more: dict[str, Any],
    rng: random.Random | None,
    read_limits: ReadLimits | None = None,
) -> Options:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise _bad("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    checked: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
            raise _bad(f"messages[{i}] must be a dict with 'role' and 'content'; got {m!r:.80}")
        if m["role"] not in _ROLES:
            raise _bad(f"messages[{i}] has role {m['role']!r}; expected one of {sorted(_ROLES)}")
        if not isinstance(m["content"], (str, list)):
            raise _bad(f"messages[{i}]['content'] must be a string or a list of content parts")
        checked.append(dict(m))
    for name, value in (("deadline", deadline), ("stall_timeout", stall_timeout)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise _bad(f"{name} must be a positive number of seconds, not {value!r}")
    for name, value in (("max_tokens", max_tokens), ("max_attempts", max_attempts)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise _bad(f"{name} must be None or a positive integer, not {value!r}")
    if not isinstance(fallback_after, int) or fallback_after < 1:
        raise _bad(f"fallback_after must be a positive integer, not {fallback_after!r}")
    reserved = _RESERVED & more.keys()
    if reserved:
        raise _bad(f"{sorted(reserved)} are set by streamres; use model=/max_tokens= instead")
    return Options(
        messages=checked,
        fleet=fleet,
        chain=tuple(chain),
        deadline=float(deadline),
        stall_timeout=float(stall_timeout),
        max_tokens=max_tokens,
        max_attempts=max_attempts,
        backoff=backoff or Backoff(),
        fallback_after=fallback_after,
        headers=dict(headers or {}),
        extra_body=more,
        rng=rng or random.Random(),
        read_limits=read_limits or ReadLimits(),
    )
