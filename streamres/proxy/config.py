"""What the proxy serves: routes, model aliases, client keys and the answer policy.

From ``routes.toml`` (``streamres proxy --config routes.toml``)::

    [policy]
    deadline = 120            # seconds per answer, retries and resumes included
    stall_timeout = 0         # 0: adaptive (follows each stream's pace)
    breaker_threshold = 3
    breaker_recovery = 60

    [[routes]]
    name = "gpt"              # the route's key (default: the model)
    model = "gpt-4o"
    provider = "openai"       # openai | anthropic | openai-responses
    base_url = "https://api.openai.com/v1"
    api_key_env = "OPENAI_API_KEY"   # the key is read from the environment, never the file
    family = "gpt-4o"
    size = 2
    weight = 1.0
    max_in_flight = 5

    [models]                  # aliases a client may ask for -> fallback chains of routes
    chat = ["gpt", "claude"]

    [accounts]                # concurrency per account (a route's account, else its base URL)
    "https://api.openai.com/v1" = 20

    [cache]                   # single-flight and an exact cache (streamres.Cache's fields)
    ttl = 600
    max_entries = 5000

    [cache.semantic]          # questions asked in other words (streamres.Semantic's fields)
    threshold = 0.93
    routes = ["gpt"]

    [[clients]]               # without any, the proxy takes no key (it listens on loopback)
    name = "ui"
    key_env = "STREAMRES_UI_KEY"
    max_in_flight = 10        # answers at once; more get 429 with Retry-After
    requests_per_minute = 120

Every route is also a model of its own name. Without a file, the proxy fronts the embedded
upstream (two models of one family under its fault storm), so the demo runs offline.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import streamres
from streamres._core.lanes import NORMAL, parse_priority
from streamres._shell.extras import install_hint, installed

__all__ = ["ClientKey", "Config", "ConfigError", "load"]


class ConfigError(ValueError):
    """The configuration cannot be used, and why."""


@dataclass(frozen=True)
class ClientKey:
    name: str
    key: str
    max_in_flight: int | None = None
    requests_per_minute: int | None = None
    #: The key's lane when slots are full (``priority = "high"``, ``"low"`` or an integer); a
    #: request may ask for a lower one with ``x-streamres-priority``, never a higher one.
    priority: int = NORMAL


@dataclass
class Config:
    routes: list[streamres.Route]
    #: Model names a client may ask for -> route keys to try, in order.
    models: dict[str, list[str]]
    clients: list[ClientKey] = field(default_factory=list)
    deadline: float = 120.0
    stall_timeout: float | None = None
    breaker_threshold: int = 3
    breaker_recovery: float = 60.0
    #: Streams at once per account (``Client(account_limits=...)``).
    accounts: dict[str, int] = field(default_factory=dict)
    #: Single-flight and the exact cache (``None``: off).
    cache: streamres.Cache | None = None
    #: The key for ``/health``, ``/metrics`` and the board when client keys are configured
    #: (``[operator] key_env``), and whether those pages are open to anyone instead
    #: (``[operator] public_health = true``).
    operator_key: str | None = None
    public_health: bool = False


_ROUTE_KEYS = {
    "name",
    "model",
    "provider",
    "base_url",
    "api_key_env",
    "family",
    "size",
    "weight",
    "max_in_flight",
    "account",
    "continuation",
}


def _route(i: int, raw: Any, environ: Mapping[str, str]) -> streamres.Route:
    where = f"routes[{i}]"
    if not isinstance(raw, Mapping) or not isinstance(raw.get("model"), str):
        raise ConfigError(f'{where}: a route needs model = "…"')
    unknown = set(raw) - _ROUTE_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}; known: {sorted(_ROUTE_KEYS)}")
    key = None
    if "api_key_env" in raw:
        key = environ.get(str(raw["api_key_env"]))
        if not key:
            raise ConfigError(f"{where}: the environment variable {raw['api_key_env']} is empty")
    args = {k: v for k, v in raw.items() if k not in ("model", "api_key_env")}
    try:
        return streamres.Route(raw["model"], api_key=key, **args)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def load(path: str, environ: Mapping[str, str] | None = None) -> Config:
    """Read ``path`` (TOML). Keys come from the environment, by the names the file gives."""
    env = os.environ if environ is None else environ
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    return parse(raw, env)


def parse(raw: Mapping[str, Any], environ: Mapping[str, str]) -> Config:
    routes = [_route(i, r, environ) for i, r in enumerate(raw.get("routes") or [])]
    if not routes:
        raise ConfigError("no [[routes]]: the proxy needs at least one model to send answers to")
    keys = {r.key for r in routes}
    models: dict[str, list[str]] = {r.key: [r.key] for r in routes}
    for alias, chain in (raw.get("models") or {}).items():
        names = [chain] if isinstance(chain, str) else chain
        if not isinstance(names, list) or not names or not all(n in keys for n in names):
            raise ConfigError(
                f"models.{alias}: a list of route names among {sorted(keys)}, not {chain!r}"
            )
        models[alias] = list(names)
    clients = []
    for i, c in enumerate(raw.get("clients") or []):
        if not isinstance(c, Mapping) or "key_env" not in c:
            raise ConfigError(f'clients[{i}]: a client needs key_env = "…"')
        key = environ.get(str(c["key_env"]))
        if not key:
            raise ConfigError(f"clients[{i}]: the environment variable {c['key_env']} is empty")
        try:
            priority = parse_priority(str(c.get("priority", NORMAL)))
        except ValueError as exc:
            raise ConfigError(f"clients[{i}].priority: {exc}") from None
        clients.append(
            ClientKey(
                name=str(c.get("name", f"client{i}")),
                key=key,
                max_in_flight=c.get("max_in_flight"),
                requests_per_minute=c.get("requests_per_minute"),
                priority=priority,
            )
        )
    accounts = raw.get("accounts") or {}
    if not isinstance(accounts, Mapping) or not all(
        isinstance(v, int) and v >= 1 for v in accounts.values()
    ):
        raise ConfigError("[accounts]: account names (or base URLs) = positive integers")
    cache = None
    if "cache" in raw:
        fields = dict(raw["cache"] or {})
        try:
            if "semantic" in fields:
                semantic = dict(fields["semantic"] or {})
                if "embed" in semantic:
                    raise ValueError("semantic.embed is a Python function: not in a file")
                if isinstance(semantic.get("routes"), list):
                    semantic["routes"] = tuple(semantic["routes"])
                fields["semantic"] = streamres.Semantic(**semantic)
                if not installed("wordllama"):
                    raise ValueError(
                        "semantic needs the bundled model's package, wordllama, which is not "
                        f"installed: {install_hint('wordllama')}"
                    )
            cache = streamres.Cache(**fields)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"[cache]: {exc}") from exc
    operator = raw.get("operator") or {}
    if not isinstance(operator, Mapping) or set(operator) - {"key_env", "public_health"}:
        raise ConfigError('[operator]: key_env = "…" (the variable with its key), public_health')
    operator_key = None
    if "key_env" in operator:
        operator_key = environ.get(str(operator["key_env"]))
        if not operator_key:
            raise ConfigError(
                f"[operator]: the environment variable {operator['key_env']} is empty"
            )
    public = operator.get("public_health", False)
    if not isinstance(public, bool):
        raise ConfigError("[operator]: public_health = true or false")
    policy = raw.get("policy") or {}
    stall = policy.get("stall_timeout", 0)
    return Config(
        routes=routes,
        models=models,
        clients=clients,
        deadline=float(policy.get("deadline", 120.0)),
        stall_timeout=float(stall) if stall else None,
        breaker_threshold=int(policy.get("breaker_threshold", 3)),
        breaker_recovery=float(policy.get("breaker_recovery", 60.0)),
        accounts=dict(accounts),
        cache=cache,
        operator_key=operator_key,
        public_health=public,
    )
