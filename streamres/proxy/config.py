"""What the proxy serves: routes, model aliases, client keys and the answer policy.

From ``routes.toml`` (``streamres proxy --config routes.toml``)::

    [policy]
    deadline = 120            # seconds per answer, retries and resumes included
    stall_timeout = 0         # 0: adaptive (follows each stream's pace)
    first_token_timeout = 60  # seconds for an attempt's first output (a model thinking)
    quick_first_token_timeout = 10  # …for a request asking no reasoning, on a model not yet learnt
    pace_floor = { relative = 0.25, window = 10 }  # opt-in: move on from a stream this slow
    header_timeout = 10       # seconds for response headers, when there is a model to fall back to
    hedge = false             # true: a model slow to start for its history races its fallback
    breaker_threshold = 3
    breaker_recovery = 60
    max_answer_chars = 4194304  # one answer's bound; past it, it ends as "length"

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
    header_timeout = 10       # this route's own header bound (a local CPU model: give it more)
    first_token_timeout = 60  # this route's own first-output bound, every request
    thinks = false            # a reasoning model (default: by its name and each request)
    replay = true             # re-attach to a stream its server kept (llama.cpp's)
    context_window = 128000   # tokens: a request too long for one model goes to a larger one

    [models]                  # aliases a client may ask for -> fallback chains of routes
    chat = ["gpt", "claude"]

    [accounts]                # concurrency per account (a route's account, else its base URL)
    "https://api.openai.com/v1" = 20

    [cache]                   # single-flight and an exact cache (streamres.Cache's fields)
    shared = false            # true: client keys share answers (each key's own by default)
    ttl = 600
    max_entries = 5000

    [cache.semantic]          # questions asked in other words (streamres.Semantic's fields)
    threshold = 0.93
    routes = ["gpt"]

    [server]                  # limits as a server (the defaults; see the README)
    connections = 8192        # at once; past it, 503
    idle_timeout = 5          # seconds a kept-alive connection may idle
    header_timeout = 60       # seconds for a request's line and headers
    header_bytes = 32768      # and their size, and count
    headers = 100
    body_bytes = 8388608      # a request body's size, and seconds for all of it
    body_timeout = 30
    write_timeout = 30        # seconds a client may read nothing before it is cut off
    grace = 10                # seconds answers in flight get when the proxy stops
    half_close = false        # true: a client that shuts its sending side still gets its answer

    [tools]
    hosted = "leave_out"      # a hosted tool a route's API does not run: "leave_out" or "refuse"

    [answers]                 # answers that outlive their connection (see the README)
    hold = 20                 # seconds an answer keeps running for a reader that went
    keep = 600                # seconds an ended (or parked) answer is kept to be read again
    max_answers = 10000       # answers held at once; past it, the longest-ended go first
    resume_wait = 10          # seconds a resume waits while shared state cannot say (then 503)

    [responses]               # stored Responses API responses (previous_response_id)
    keep = 2592000            # seconds a stored response is kept (30 days)
    max_bytes = 268435456     # bytes of stored responses in memory; past it, the oldest go

    [[clients]]               # without any, the proxy takes no key (it listens on loopback)
    name = "ui"
    key_env = "STREAMRES_UI_KEY"
    max_in_flight = 10        # answers at once; more get 429 with Retry-After
    requests_per_minute = 120
    priority = "normal"       # its lane: high, normal, low, background, or an integer

Every route is also a model of its own name. Without a file, the proxy fronts the embedded
upstream (two models of one family under its fault storm), so the demo runs offline.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import streamres
from streamres._shell.apps import (
    ANSWER,
    FIRST_OUTPUT,
    HEADERS,
    NORMAL,
    QUICK_FIRST,
    install_hint,
    installed,
    parse_priority,
)

__all__ = [
    "ClientKey",
    "Config",
    "ConfigError",
    "HoldLimits",
    "ServerLimits",
    "StoreLimits",
    "load",
]

_T = TypeVar("_T")


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


@dataclass(frozen=True)
class ServerLimits:
    """The proxy's limits as a server (``[server]`` in ``routes.toml``); see the README."""

    #: Requests served at once (a held answer's reader counts while it reads); past it, the
    #: excess — only the excess — gets 503 with Retry-After in its API's error shape.
    connections: int = 8192
    #: Seconds a kept-alive connection may sit idle between requests.
    idle_timeout: float = 5.0
    #: Seconds for a request's line and headers to arrive (nginx's ``client_header_timeout``
    #: and Node's ``headersTimeout`` default: a client bursting thousands of requests from one
    #: busy process may take seconds to send a head after connecting).
    header_timeout: float = 60.0
    #: Bytes of a request's line and headers, and how many headers.
    header_bytes: int = 32 * 1024
    headers: int = 100
    #: Bytes of a request body, and seconds for the whole of it to arrive.
    body_bytes: int = 8 * 1024 * 1024
    body_timeout: float = 30.0
    #: Seconds a client may read nothing of its response before it is cut off.
    write_timeout: float = 30.0
    #: Seconds answers in flight get to finish when the proxy stops.
    grace: int = 10
    #: A client that shuts its sending side after the request still gets the response (else
    #: that is taken as leaving: a FIN cannot be told from a close, and a close frees the
    #: answer's upstream stream and slots at once).
    half_close: bool = False
    #: Without client keys the proxy is private: a request that reached it on a loopback
    #: address must name a loopback host (``Host``), and a browser's request must come from
    #: the proxy's own origin (``Origin``) — so no web page, by a cross-origin POST or a DNS
    #: name rebound to 127.0.0.1, can start answers on the operator's upstream keys. These
    #: open it further: more host names, more origins (``["*"]``: any).
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("allowed_hosts", "allowed_origins"):
            value = getattr(self, name)
            if isinstance(value, list):
                value = tuple(value)
                object.__setattr__(self, name, value)
            if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"server.{name} must be a list of strings, not {value!r}")
        for name, low in (
            ("connections", 1),
            ("header_bytes", 1024),
            ("headers", 8),
            ("body_bytes", 1024),
            ("grace", 0),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"server.{name} must be an integer >= {low}, not {value!r}")
        if not isinstance(self.half_close, bool):
            raise ValueError(f"server.half_close must be true or false, not {self.half_close!r}")
        for name in ("idle_timeout", "header_timeout", "body_timeout", "write_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"server.{name} must be a number of seconds > 0, not {value!r}")


@dataclass(frozen=True)
class HoldLimits:
    """``[answers]`` in ``routes.toml``: how long an answer keeps running for a reader that
    went (``hold``, seconds; 0 closes the upstream at once, the partial still kept for a
    resume), how long an ended or parked answer is kept to be read again (``keep``), and how
    many answers are held at once (``max_answers``), and how many readers one answer may have
    at once (``max_readers``: each is sent the whole answer; a person's tabs, not a crowd)."""

    hold: float = 20.0
    keep: float = 600.0
    max_answers: int = 10_000
    max_readers: int = 8
    #: Bytes of answers held in memory (as estimated: their events, encoded and not), in all
    #: and per client key; past them, a key's own ended answers are forgotten first, and a
    #: new answer that still does not fit is refused (the key's: 429; the proxy's: 503).
    max_bytes: int = 512 * 2**20
    max_bytes_per_key: int = 128 * 2**20
    #: Seconds a request to read an answer again waits while shared state cannot say whether
    #: it exists (Redis away, or just back and being written again): then it streams the
    #: rest, or, past the wait, 503 with Retry-After. A browser's ``EventSource`` gives up on
    #: any status but 200, so a reload during a Redis restart waits rather than fails.
    resume_wait: float = 10.0

    def __post_init__(self) -> None:
        for name in ("hold", "keep", "resume_wait"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"answers.{name} must be a number of seconds >= 0, not {value!r}")
        for name in ("max_answers", "max_readers", "max_bytes", "max_bytes_per_key"):
            m = getattr(self, name)
            if isinstance(m, bool) or not isinstance(m, int) or m < 1:
                raise ValueError(f"answers.{name} must be an integer >= 1, not {m!r}")


@dataclass(frozen=True)
class StoreLimits:
    """``[responses]`` in ``routes.toml``: how long a stored Responses API response is kept
    (``keep``, seconds: what ``previous_response_id``, ``GET``, ``DELETE`` and ``input_items``
    find), and the bytes of stored responses one process keeps in memory (``max_bytes``; past
    it, the oldest go from memory — with shared state, Redis still has them until ``keep``)."""

    keep: float = 30 * 86400.0
    max_bytes: int = 256 * 2**20

    def __post_init__(self) -> None:
        if isinstance(self.keep, bool) or not isinstance(self.keep, int | float) or self.keep <= 0:
            raise ValueError(f"responses.keep must be a number of seconds > 0, not {self.keep!r}")
        m = self.max_bytes
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"responses.max_bytes must be an integer >= 1, not {m!r}")


@dataclass
class Config:
    routes: list[streamres.Route]
    #: Model names a client may ask for -> route keys to try, in order.
    models: dict[str, list[str]]
    clients: list[ClientKey] = field(default_factory=list)
    deadline: float = 120.0
    stall_timeout: float | None = None
    #: Seconds for an attempt's first output, and for response headers when a chain has
    #: another model to go to (``[policy]``; a route's own ``header_timeout`` wins).
    first_token_timeout: float = FIRST_OUTPUT
    header_timeout: float = HEADERS
    #: Seconds for a quick request's first output on a model with no history yet, when a
    #: chain has another model to go to (``[policy] quick_first_token_timeout``).
    quick_first_token_timeout: float = QUICK_FIRST
    #: A floor on a producing stream's pace (``[policy] pace_floor = {relative = 0.25}``).
    pace_floor: streamres.PaceFloor | None = None
    #: A hedged first token (``[policy] hedge``, ``Client(hedge=...)``).
    hedge: bool = False
    breaker_threshold: int = 3
    breaker_recovery: float = 60.0
    #: Streams at once per account (``Client(account_limits=...)``).
    accounts: dict[str, int] = field(default_factory=dict)
    #: Single-flight and the exact cache (``None``: off).
    cache: streamres.Cache | None = None
    #: Answers shared across client keys (``[cache] shared = true``); by default each key's
    #: answers are its own (cache, single-flight and the semantic cache alike).
    cache_shared: bool = False
    #: Characters one answer may deliver (``[policy] max_answer_chars``, ``ReadLimits.answer``).
    max_answer_chars: int = ANSWER
    #: The key for ``/health``, ``/metrics`` and the board when client keys are configured
    #: (``[operator] key_env``), and whether those pages are open to anyone instead
    #: (``[operator] public_health = true``).
    operator_key: str | None = None
    public_health: bool = False
    #: The proxy's limits as a server (``[server]``).
    server: ServerLimits = field(default_factory=ServerLimits)
    #: Answers held for readers that go and come back (``[answers]``).
    answers: HoldLimits = field(default_factory=HoldLimits)
    #: Stored Responses API responses (``[responses]``).
    responses: StoreLimits = field(default_factory=StoreLimits)
    #: A hosted tool (web search, code interpreter, MCP…) asked of a model whose chain has a
    #: route whose API does not run it (``[tools] hosted``): ``"leave_out"`` (the request is
    #: served without it, and the log says so) or ``"refuse"`` (a 400 naming tool and route).
    hosted_tools: str = "leave_out"

    def client_options(self) -> dict[str, Any]:
        """What this configuration says of a ``Client``: its routes, account limits and
        policy (the proxy and ``streamres batch --config`` build theirs from it)."""
        return {
            "routes": self.routes,
            "account_limits": self.accounts,
            "deadline": self.deadline,
            "stall_timeout": self.stall_timeout,
            "first_token_timeout": self.first_token_timeout,
            "header_timeout": self.header_timeout,
            "quick_first_token_timeout": self.quick_first_token_timeout,
            "pace_floor": self.pace_floor,
            "hedge": self.hedge,
            "breaker_threshold": self.breaker_threshold,
            "breaker_recovery": self.breaker_recovery,
        }


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
    "replay",
    "header_timeout",
    "context_window",
    "thinks",
    "first_token_timeout",
    "continue_instruction",
}

#: The tables of ``routes.toml`` and the keys of each (``routes`` is checked per route).
_TABLES = (
    "policy",
    "routes",
    "models",
    "accounts",
    "cache",
    "server",
    "answers",
    "responses",
    "clients",
    "operator",
    "tools",
)
_POLICY_KEYS = (
    "deadline",
    "stall_timeout",
    "first_token_timeout",
    "header_timeout",
    "quick_first_token_timeout",
    "pace_floor",
    "hedge",
    "breaker_threshold",
    "breaker_recovery",
    "max_answer_chars",
)
_CLIENT_KEYS = ("name", "key_env", "max_in_flight", "requests_per_minute", "priority")
_OPERATOR_KEYS = ("key_env", "public_health")


def _one_name_each(clients: list[ClientKey]) -> None:
    """A client's name is its tenancy (its answers, cache scope and quotas): two keys under one
    name would read and stop each other's answers, and one key twice would be two tenants."""
    for what, said in (
        ("name", "are both named {!r} (an unnamed client is client<i>): give each its own name"),
        ("key", "have the same key: one key is one client"),
    ):
        seen: dict[str, int] = {}
        for i, client in enumerate(clients):
            value = getattr(client, what)
            if value in seen:
                # The key itself is never said: only which clients share it.
                shown = said.format(value) if what == "name" else said
                raise ConfigError(f"clients[{seen[value]}] and clients[{i}] {shown}")
            seen[value] = i


def _pace_floor(raw: Any) -> streamres.PaceFloor | None:
    """``[policy] pace_floor``: an inline table of ``streamres.PaceFloor``'s fields."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ConfigError(
            f"[policy]: pace_floor is a table like {{relative = 0.25, window = 10}}, not {raw!r}"
        )
    _known("[policy] pace_floor: ", raw, ("relative", "absolute", "window"))
    try:
        return streamres.PaceFloor(**raw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"[policy]: {exc}") from None


def _positive(key: str, policy: Mapping[str, Any], default: float) -> float:
    """``[policy] key``: a positive number of seconds (``default`` when absent)."""
    value = policy.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"[policy]: {key} must be a positive number of seconds, not {value!r}")
    return float(value)


def _table(raw: Mapping[str, Any], name: str, cls: type[_T]) -> _T:
    """The dataclass of limits a table names (``[server]``, ``[answers]``), its values checked
    by the class; a bad one is one line naming it."""
    table = raw.get(name) or {}
    if not isinstance(table, Mapping):
        fields = ", ".join(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]
        raise ConfigError(f"[{name}]: a table ({fields}; see the README)")
    try:
        return cls(**table)
    except ValueError as exc:
        raise ConfigError(f"[{name}]: {exc}") from None


def _known(where: str, raw: Any, known: Iterable[str], what: str = "key") -> None:
    """Refuse a key (or a table) the file names that is not one of ``known``: a misspelt one
    would be ignored and what the user set lost."""
    if not isinstance(raw, Mapping):
        return
    names = list(known)
    for given in raw:
        if given not in names:
            near = difflib.get_close_matches(str(given), names, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise ConfigError(
                f"{where}known {what}s are {', '.join(names)}; {given!r} is not one{hint}"
            )


def _route(i: int, raw: Any, environ: Mapping[str, str]) -> streamres.Route:
    where = f"routes[{i}]"
    _known(f"{where}: ", raw, sorted(_ROUTE_KEYS))
    if not isinstance(raw, Mapping) or not isinstance(raw.get("model"), str):
        raise ConfigError(f'{where}: a route needs model = "…"')
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
    _known("", raw, _TABLES, "table")
    _known("[policy]: ", raw.get("policy"), _POLICY_KEYS)
    _known("[operator]: ", raw.get("operator"), _OPERATOR_KEYS)
    _known("[tools]: ", raw.get("tools"), ("hosted",))
    tools = raw.get("tools")
    hosted = tools.get("hosted", "leave_out") if isinstance(tools, Mapping) else "leave_out"
    if hosted not in ("leave_out", "refuse"):
        raise ConfigError(f'[tools]: hosted = "leave_out" or "refuse", not {hosted!r:.40}')
    _known("[server]: ", raw.get("server"), [f.name for f in dataclasses.fields(ServerLimits)])
    _known("[answers]: ", raw.get("answers"), [f.name for f in dataclasses.fields(HoldLimits)])
    _known("[responses]: ", raw.get("responses"), [f.name for f in dataclasses.fields(StoreLimits)])
    for i, c in enumerate(raw.get("clients") or []):
        _known(f"clients[{i}]: ", c, _CLIENT_KEYS)
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
    _one_name_each(clients)
    accounts = raw.get("accounts") or {}
    if not isinstance(accounts, Mapping) or not all(
        isinstance(v, int) and v >= 1 for v in accounts.values()
    ):
        raise ConfigError("[accounts]: account names (or base URLs) = positive integers")
    cache, shared = None, False
    if "cache" in raw:
        fields = dict(raw["cache"] or {})
        shared = fields.pop("shared", False)
        if not isinstance(shared, bool):
            raise ConfigError("[cache]: shared = true or false")
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
    limits = _table(raw, "server", ServerLimits)
    held = _table(raw, "answers", HoldLimits)
    stored = _table(raw, "responses", StoreLimits)
    policy = raw.get("policy") or {}
    stall = policy.get("stall_timeout", 0)
    answer = policy.get("max_answer_chars", ANSWER)
    try:
        streamres.ReadLimits(answer=answer)
    except ValueError:
        raise ConfigError(
            f"[policy]: max_answer_chars must be an integer >= 1024, not {answer!r}"
        ) from None
    hedge = policy.get("hedge", False)
    if not isinstance(hedge, bool):
        raise ConfigError(f"[policy]: hedge must be true or false, not {hedge!r}")
    return Config(
        routes=routes,
        models=models,
        clients=clients,
        deadline=float(policy.get("deadline", 120.0)),
        stall_timeout=float(stall) if stall else None,
        first_token_timeout=_positive("first_token_timeout", policy, FIRST_OUTPUT),
        header_timeout=_positive("header_timeout", policy, HEADERS),
        quick_first_token_timeout=_positive("quick_first_token_timeout", policy, QUICK_FIRST),
        pace_floor=_pace_floor(policy.get("pace_floor")),
        hedge=hedge,
        breaker_threshold=int(policy.get("breaker_threshold", 3)),
        breaker_recovery=float(policy.get("breaker_recovery", 60.0)),
        accounts=dict(accounts),
        cache=cache,
        cache_shared=shared,
        max_answer_chars=answer,
        operator_key=operator_key,
        public_health=public,
        server=limits,
        answers=held,
        responses=stored,
        hosted_tools=hosted,
    )
