"""``streamres.Client``: the shared state of many streams over many models.

A long-lived async context manager (like ``httpx.AsyncClient``) holding connections, the
models (routes) and their health — breakers, weights, cool-downs — the concurrency limits, one
retry budget, and per-model metrics. ``client.stream(...)`` yields the same events as
``stream_resilient()``.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import replace
from types import TracebackType
from typing import Any

import anyio
import anyio.abc
import httpx

from streamres._answer.options import Options, check_client_routes, check_options
from streamres._core.backoff import Backoff
from streamres._core.bounds import ReadLimits
from streamres._core.cache import Cache, CacheStats, cache_key
from streamres._core.errors import InvalidRequest
from streamres._core.events import Event
from streamres._core.lanes import NORMAL
from streamres._core.semantic import split_question
from streamres._core.stall import (
    FIRST_OUTPUT,
    HEADERS,
    QUICK_FIRST,
    first_output_limit,
    request_kind,
)
from streamres._core.trickle import PaceFloor
from streamres._fleet.balance import RetryBudget
from streamres._fleet.fleet import Fleet
from streamres._fleet.metrics import Health, ModelMetrics
from streamres._fleet.routes import Route
from streamres._shell.extras import require
from streamres._shell.flights import Flights, Question
from streamres._shell.hedge import hedged
from streamres._shell.limits import Limits
from streamres._shell.log import log
from streamres._shell.shared import SharedState, SharedStatus
from streamres._shell.shared.cache import SharedCache
from streamres._shell.shared.servers import Servers
from streamres._shell.stream import (
    POOLS,
    Pools,
    ResilientStream,
    _run,
    _shared_ssl_context,
)
from streamres._shell.tracing import Tracing, traced

__all__ = ["Client"]


class Client:
    """Streams over a set of routes, sharing their health, limits and metrics.

    >>> routes = [
    ...     Route("gpt-4o", family="gpt-4o", size=2, max_in_flight=5),
    ...     Route("gpt-4o-mini", family="gpt-4o", size=1),
    ...     Route("claude-sonnet-4-5", provider="anthropic", weight=0.5),
    ... ]
    >>> async with Client(routes) as client:
    ...     async for ev in client.stream(messages, model="gpt-4o"):
    ...         ...

    Defaults: breaker threshold 3 consecutive failures (on a busy model — 20 attempts in
    about the last minute — with at least half of its last 10 s of attempts failed too) and
    60 s recovery; weights x0.7 per
    failure, a quarter of the way back per success, never below 5 % of base; retry budget
    20 % of first attempts plus 1 retry/s, banked up to 10.

    ``shared="redis://host:6379/0"`` shares concurrency slots, breaker openings, cool-downs,
    the half-open probe, the retry budget, weights, metrics (:meth:`fleet_metrics`) and the
    answer cache with every process using the same Redis and ``shared_prefix``.
    ``cache=Cache(...)`` turns on single-flight and the answer cache (exact, and with
    ``Cache(semantic=Semantic())`` questions asked in other words). ``hedge=True``: when a
    model is slow to start for its own history, the next model is asked alongside and the
    first to stream is kept, the other closed at once (``_shell/hedge``: the cost is a second
    request open for that moment).
    """

    def __init__(
        self,
        routes: Sequence[Route],
        *,
        account_limits: Mapping[str, int] | None = None,
        breaker_threshold: int = 3,
        breaker_recovery: float = 60.0,
        retry_budget: RetryBudget | None = None,
        http_client: httpx.AsyncClient | None = None,
        deadline: float = 120.0,
        stall_timeout: float | None = None,
        first_token_timeout: float = FIRST_OUTPUT,
        header_timeout: float = HEADERS,
        quick_first_token_timeout: float = QUICK_FIRST,
        pace_floor: PaceFloor | None = None,
        backoff: Backoff | None = None,
        fallback_after: int = 2,
        rng: random.Random | None = None,
        read_limits: ReadLimits | None = None,
        shared: str | None = None,
        shared_prefix: str = "streamres",
        cache: Cache | None = None,
        tracing: Any = None,
        capture_content: bool = False,
        metrics: Any = None,
        hedge: bool = False,
    ) -> None:
        if not isinstance(hedge, bool):
            raise InvalidRequest(
                f"hedge must be True or False, not {hedge!r:.60}", reason="invalid"
            )
        self._hedge = hedge
        if http_client is not None and not isinstance(http_client, httpx.AsyncClient):
            raise InvalidRequest(
                f"http_client must be an httpx.AsyncClient (or None), not {http_client!r:.60}",
                reason="invalid",
            )
        resolved = check_client_routes(
            routes, account_limits, retry_budget, breaker_threshold, breaker_recovery
        )
        self.routes = tuple(resolved)
        self.fleet = Fleet(
            resolved,
            breaker_threshold=breaker_threshold,
            breaker_recovery=breaker_recovery,
            budget=retry_budget,
        )
        # The stream defaults are checked now, as they will be at each stream.
        check_options(
            [{"role": "user", "content": ""}],
            fleet=self.fleet,
            chain=[0],
            deadline=deadline,
            stall_timeout=stall_timeout,
            first_token_timeout=first_token_timeout,
            header_timeout=header_timeout,
            quick_first_token_timeout=quick_first_token_timeout,
            pace_floor=pace_floor,
            max_tokens=None,
            max_attempts=None,
            backoff=backoff,
            fallback_after=fallback_after,
            headers=None,
            more={},
            rng=rng,
            read_limits=read_limits,
        )
        self._account_limits = dict(account_limits or {})
        self._limits: Limits | None = None
        self._http = http_client
        self._own_http = http_client is None
        #: The connection pools this client made (none when given ``http_client``).
        self._pools: Pools | None = None
        self._deadline = deadline
        self._stall_timeout = stall_timeout
        self._first_token_timeout = first_token_timeout
        self._header_timeout = header_timeout
        self._quick_first_token_timeout = quick_first_token_timeout
        self._pace_floor = pace_floor
        self._backoff = backoff
        self._fallback_after = fallback_after
        self._rng = rng or random.Random()
        self._read_limits = read_limits
        self._tracing = Tracing(tracing, capture_content=capture_content, metrics=metrics)
        if shared is not None:
            try:
                if not isinstance(shared, str):
                    raise ValueError(
                        f"shared must be a Redis URL (redis://host:6379/0), not {shared!r:.60}"
                    )
                Servers.parse(shared)
            except ValueError as exc:
                raise InvalidRequest(str(exc), reason="invalid") from None
        if shared is not None:
            require("coredis", "shared state (shared=)")
        if cache is not None and not isinstance(cache, Cache):
            raise InvalidRequest(
                f"cache must be a streamres.Cache(...), not {cache!r:.60}", reason="invalid"
            )
        if cache is not None and cache.semantic is not None and cache.semantic.embed is None:
            require(
                "wordllama",
                "Cache(semantic=Semantic())'s bundled embedding model",
                otherwise="pass Semantic(embed=your_function)",
            )
        self._cache = cache
        self._flights: Flights | None = None
        self._shared = shared
        self._shared_prefix = shared_prefix
        self._shared_state: SharedState | None = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._tg: anyio.abc.TaskGroup | None = None

    async def __aenter__(self) -> Client:
        if self._http is None:
            verify = await _shared_ssl_context()
            self._pools = Pools.made(verify, POOLS)
            self._http = self._pools.clients[0]
        self._stack = contextlib.AsyncExitStack()
        tg = await self._stack.enter_async_context(anyio.create_task_group())
        self._tg = tg  # the answers' own tasks (flights, hedges) end with the client
        self._stack.callback(tg.cancel_scope.cancel)  # flights in progress end with the client
        if self._cache is not None:
            self._flights = Flights(self._cache, tg)
            if self._cache.semantic is not None:
                tg.start_soon(_load_model, self._flights)
        if self._shared is None:
            self._limits = Limits(self.routes, self._account_limits)
            tg.start_soon(self._limits.lag.watch)
            return self
        state = SharedState(
            self._shared,
            self.routes,
            self._account_limits,
            self.fleet,
            prefix=self._shared_prefix,
        )
        await self._stack.enter_async_context(state.running())
        self._shared_state = state
        self._limits = state
        tg.start_soon(state.lag.watch)
        if self._flights is not None:
            flights = self._flights
            answers = SharedCache(state, flights.cache)
            if flights.semantic is not None:
                answers.on_question = flights.index.add
                await answers.load_questions()
            flights.remote = answers
            self._stack.callback(setattr, flights, "remote", None)  # before Redis closes
        return self

    def shared_status(self) -> SharedStatus | None:
        """Shared state's URL (credentials masked), whether it is reachable, and how many slots
        this process took on its own while it was not; ``None`` without ``shared=``."""
        return self._shared_state.status() if self._shared_state is not None else None

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._limits = None
        if self._stack is not None:
            stack, self._stack, self._shared_state = self._stack, None, None
            self._flights = None
            await stack.aclose()
        if self._own_http and self._http is not None:
            for pool in self._pools.clients if self._pools is not None else []:
                await pool.aclose()
            self._pools = None
            self._http = None

    def stream(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        model: str | Sequence[str] | None = None,
        fallback: bool = True,
        deadline: float | None = None,
        stall_timeout: float | None = None,
        first_token_timeout: float | None = None,
        header_timeout: float | None = None,
        quick_first_token_timeout: float | None = None,
        max_tokens: int | None = None,
        max_attempts: int | None = None,
        headers: Mapping[str, str] | None = None,
        cache_scope: str | None = None,
        priority: int | str = NORMAL,
        continue_from: str = "",
        hedge: bool | None = None,
        continue_instruction: str | None = None,
        pace_floor: PaceFloor | None = None,
        **more: Any,
    ) -> ResilientStream:
        """Stream one answer. ``model``: a route name (then its fallbacks, unless
        ``fallback=False``), an explicit sequence of route names, or ``None`` to pick by
        weight. ``cache_scope``: with ``cache=``, answers are shared (cached, single-flight,
        semantic) only between requests of the same scope — a tenant, a team, a user; the
        proxy scopes by client key. ``priority``: the answer's lane when its route's or
        account's slots are full — an integer, higher first, or ``"high"`` (10), ``"normal"``
        (0, the default), ``"low"`` (-10); a free slot goes to the highest waiting lane, first
        come first served within one, across processes too with ``shared=``.
        ``continue_from``: text of this answer the caller already has (see
        :class:`~streamres.AnswerLog`): the rest is asked for, never cached or shared.
        ``hedge``: this answer's own choice over the client's ``hedge=`` — when the first
        model is slow to start for its history, start the fallback alongside and keep the
        first to stream (see ``_shell/hedge``; two requests open for a moment, the loser
        closed at once). Other arguments as for :func:`stream_resilient`."""
        if self._http is None or self._limits is None:
            raise InvalidRequest(
                "use the client inside `async with Client(...) as client:`", reason="invalid"
            )
        if cache_scope is not None and not isinstance(cache_scope, str):
            raise InvalidRequest(
                f"cache_scope must be a string, not {cache_scope!r:.60}", reason="invalid"
            )
        if model is not None and not isinstance(model, (str, Sequence)):
            raise InvalidRequest(
                f"model must be a route name, a list of them, or None, not {model!r:.60}",
                reason="invalid",
            )
        names = [model] if isinstance(model, str) else list(model or [])
        unknown = [m for m in names if not isinstance(m, str) or m not in self.fleet.by_key]
        if unknown:
            raise InvalidRequest(
                f"unknown model {unknown[0]!r}; routes are {sorted(self.fleet.by_key)}",
                reason="invalid",
            )
        chain = self.fleet.chain(model, fallback=fallback, rand=self._rng.random())
        opts = check_options(
            messages,
            fleet=self.fleet,
            chain=chain,
            deadline=self._deadline if deadline is None else deadline,
            stall_timeout=self._stall_timeout if stall_timeout is None else stall_timeout,
            first_token_timeout=(
                self._first_token_timeout if first_token_timeout is None else first_token_timeout
            ),
            header_timeout=self._header_timeout if header_timeout is None else header_timeout,
            quick_first_token_timeout=(
                self._quick_first_token_timeout
                if quick_first_token_timeout is None
                else quick_first_token_timeout
            ),
            max_tokens=max_tokens,
            max_attempts=max_attempts,
            backoff=self._backoff,
            fallback_after=self._fallback_after,
            headers=headers,
            more=more,
            rng=self._rng,
            read_limits=self._read_limits,
            priority=priority,
            continue_from=continue_from,
            continue_instruction=continue_instruction,
            pace_floor=self._pace_floor if pace_floor is None else pace_floor,
        )
        limits = self._limits
        # Streams spread over the client's pools (see POOLS), or the caller's own client.
        http: httpx.AsyncClient | Pools | None = self._pools or self._http
        trace = None
        if self._tracing.enabled:
            trace = self._tracing.answer(
                opts.messages, self.fleet.routes[chain[0]], more, max_tokens
            )
            opts = replace(opts, headers={**opts.headers, **trace.headers()})

        def events(gen: AsyncIterator[Event]) -> ResilientStream:
            return ResilientStream(gen if trace is None else traced(gen, trace), trace)

        if hedge is not None and not isinstance(hedge, bool):
            raise InvalidRequest(
                f"hedge must be True or False, not {hedge!r:.60}", reason="invalid"
            )
        hedging = self._hedge if hedge is None else hedge
        answer = (self._hedged(opts, http, limits) if hedging else None) or (
            lambda: _run(opts, http, limits)
        )
        if self._flights is None or opts.continue_from:
            return events(answer())
        routes = [self.fleet.routes[i].key for i in chain]
        params = {**more, "_headers": dict(headers or {}), "_scope": cache_scope}
        key = cache_key(messages, routes, max_tokens, params)
        keep = self._flights.cache.keeps(more)
        question = None
        semantic = self._flights.semantic
        split = split_question(messages) if semantic and semantic.applies_to(routes[0]) else None
        if keep and split is not None:
            context, text = split
            question = Question(cache_key(context, routes, max_tokens, params), text)
        return events(self._flights.stream(key, keep, opts.deadline, answer, question))

    def _hedged(
        self, opts: Options, http: httpx.AsyncClient | Pools | None, limits: Limits | None
    ) -> Callable[[], AsyncIterator[Event]] | None:
        """The answer hedged (``_shell/hedge``), when its first model has a fallback and a
        first-output limit learnt from its history; else ``None``."""
        first, rest = opts.chain[0], [i for i in opts.chain if i != opts.chain[0]]
        route = self.fleet.routes[first]
        asked = request_kind(opts.extra_body, route.model, route.thinks)
        after = first_output_limit(self.fleet.ttft_samples(first, asked), opts.first_token_timeout)
        if not rest or after >= opts.first_token_timeout or self._tg is None or opts.continue_from:
            return None
        tg, routes = self._tg, self.fleet.routes
        own = replace(opts, hedged=True)

        def answer() -> AsyncIterator[Event]:
            began = anyio.current_time()

            def second() -> AsyncIterator[Event]:
                left = max(0.001, opts.deadline - (anyio.current_time() - began))
                return _run(replace(opts, chain=tuple(rest), deadline=left), http, limits)

            return hedged(
                tg,
                lambda: _run(own, http, limits),
                second,
                after=after,
                first_model=routes[first].key,
                second_model=routes[rest[0]].key,
            )

        return answer

    async def cache_ready(self) -> bool:
        """Wait until the semantic cache's model is loaded (it loads in the background when the
        client starts; until then questions are matched by their normalised text). ``False``
        if it could not load, or without ``Cache(semantic=...)``."""
        if self._flights is None or self._flights.semantic is None:
            return False
        await self._flights.embedder.settled.wait()
        return self._flights.embedder.ready

    def cache_stats(self) -> CacheStats | None:
        """Cache hits and misses, single-flight joins, requests saved; ``None`` without a
        ``cache=``."""
        return self._flights.stats if self._flights is not None else None

    def metrics(self) -> dict[str, ModelMetrics]:
        """A snapshot of every model's metrics, by route name."""
        try:
            now: float | None = anyio.current_time()
        except RuntimeError:  # outside an event loop: cool-downs cannot be read
            now = None
        return self.fleet.metrics(now)

    def fleet_metrics(self) -> dict[str, ModelMetrics]:
        """Every model's metrics summed over the processes sharing state with this one (this
        one's now, the others' as of the last sync, at most a second old); weights, breakers
        and cool-downs as this process sees them (shared, so the same). Without ``shared=``
        (or while Redis is away), this process's own — as :meth:`metrics`."""
        state = self._shared_state
        if state is None or not state.connected:
            return self.metrics()
        try:
            now: float | None = anyio.current_time()
        except RuntimeError:
            now = None
        return self.fleet.fleet_metrics([self.fleet.exported(now), *state.others], now)

    def health(self) -> dict[str, Health]:
        """Which models are healthy, degraded, degrading or jammed, and why."""
        return {name: m.health for name, m in self.metrics().items()}


async def _load_model(flights: Flights) -> None:
    """Load the semantic cache's model off the loop; until then (or if it cannot load)
    questions are matched by their normalised text."""
    try:
        await flights.embedder.load()
    except Exception as exc:
        log.warning("streamres.semantic_model_unavailable", error=f"{type(exc).__name__}: {exc}")
