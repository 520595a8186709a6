"""Running the proxy: a ``streamres.Client`` for the configured routes (or the embedded
upstream), the ASGI app over it, and uvicorn serving it on loopback.

uvicorn was chosen by measuring it against hypercorn on the same app (``streamres bench proxy``
reports both): it adds less time per relayed event. Shutdown is graceful: on SIGINT/SIGTERM the
server stops accepting, and answers in flight get ``[server] grace`` seconds to finish; one
still streaming then ends with an error event after its partial answer. The server's limits on
connections (``[server]``) are uvicorn's settings and :mod:`.connections`' protocol.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import socket
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio

import streamres
from streamres._shell.apps import installed, log, redact_url, require
from streamres.proxy.config import Config, HoldLimits, ServerLimits, load
from streamres.proxy.server.app import Proxy
from streamres.upstream import PRESETS, FaultPlan, ModelSpec, Upstream, demo_storm

__all__ = ["Running", "embedded_config", "embedded_models", "require_server", "running", "serve"]

LARGE, SMALL = "demo-large", "demo-small"


def embedded_config(up: Upstream) -> Config:
    """The embedded upstream's two models, and ``demo`` (and ``chat``): the large one, then the
    small."""
    routes = [
        streamres.Route(LARGE, base_url=up.openai_url, api_key="demo", family="demo", size=2),
        streamres.Route(SMALL, base_url=up.openai_url, api_key="demo", family="demo", size=1),
    ]
    # ``chat``: the name demos/routes.toml gives the same chain, so an example runs against
    # either proxy the README starts.
    models = {LARGE: [LARGE, SMALL], SMALL: [SMALL], "demo": [LARGE, SMALL], "chat": [LARGE, SMALL]}
    return Config(routes=routes, models=models, breaker_recovery=10.0)


def storm(seed: int = 7) -> dict[str, ModelSpec]:
    """The embedded upstream's default fault storm (the same as ``streamres chat``'s)."""
    large, small = demo_storm(seed)
    return {LARGE: ModelSpec(faults=large), SMALL: ModelSpec(faults=small)}


def embedded_models(faults: str) -> dict[str, ModelSpec]:
    """The embedded upstream's models under ``faults``: ``storm`` (the demo's), a preset
    (``none``, ``light``) or a plan such as ``529,reset@40``, applied to the large model.
    A plan that does not parse is a ``ValueError`` naming what is wrong."""
    if faults == "storm":
        return storm()
    return {LARGE: ModelSpec(faults=FaultPlan(PRESETS.get(faults, faults))), SMALL: ModelSpec()}


def require_server(server: str) -> None:
    """The ASGI server's package is installed, or one :class:`~streamres.MissingExtra` line
    naming the extra that brings it."""
    if server not in ("uvicorn", "hypercorn"):
        raise ValueError(f"server must be 'uvicorn' or 'hypercorn', not {server!r}")
    require(server, f"streamres proxy (--server {server})")


def event_loop(loop: str) -> dict[str, Any]:
    """anyio's backend options for ``--loop``: ``uvloop`` (libuv's loop, as uvicorn picks
    it), ``asyncio`` (the standard library's), or ``auto`` (uvloop when it is installed,
    which ``streamres[proxy]`` does where it runs: not on Windows)."""
    if loop not in ("auto", "asyncio", "uvloop"):
        raise ValueError(f"loop must be 'auto', 'asyncio' or 'uvloop', not {loop!r}")
    if loop == "uvloop":
        require("uvloop", "streamres proxy --loop uvloop", otherwise="--loop asyncio")
    use = loop == "uvloop" or (loop == "auto" and installed("uvloop"))
    return {"use_uvloop": use}


@contextlib.asynccontextmanager
async def _proxy_app(config: Config, redis: str | None) -> AsyncIterator[Proxy]:
    """The ASGI app over a client for ``config`` (shared through ``redis`` when given)."""
    from streamres._shell.apps import load_counter

    # The client's own connection pools (``POOLS``): one pool for thousands of answers costs
    # the square of them (5,000 through one spent 58 % of the proxy's CPU in httpcore's pool).
    async with streamres.Client(
        **config.client_options(),
        shared=redis,
        cache=config.cache,
        read_limits=streamres.ReadLimits(answer=config.max_answer_chars),
    ) as client:
        for route in config.routes:  # token counts are never loaded on an answer's path
            await load_counter(route.model)
        proxy = Proxy(client, config)
        async with proxy.answers.run():  # streamed answers outlive their requests
            yield proxy


class WorkerApp:
    """One uvicorn worker of ``streamres proxy --workers N``: builds its client at startup (ASGI
    lifespan) from the configuration the parent process names in the environment."""

    def __init__(self) -> None:
        self.app: Proxy | None = None
        self._stack = contextlib.AsyncExitStack()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    config = load(os.environ["STREAMRES_PROXY_CONFIG"])
                    redis = os.environ.get("STREAMRES_PROXY_REDIS") or None
                    from streamres.proxy.server.connections import Guarded

                    Guarded.limits = config.server
                    self.app = await self._stack.enter_async_context(_proxy_app(config, redis))
                    _freeze()
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await self._stack.aclose()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        assert self.app is not None
        await self.app(scope, receive, send)


def worker_app() -> WorkerApp:
    """uvicorn's factory for each worker process."""
    return WorkerApp()


def serve_workers(
    config_path: str,
    redis: str | None,
    host: str,
    port: int,
    workers: int,
    loop: str = "auto",
) -> None:
    """``streamres proxy --workers N``: N processes on one port (uvicorn's supervisor)."""
    require_server("uvicorn")
    import uvicorn

    limits = _open_files(load(config_path).server)
    _can_listen(host, port)  # a port in use is one line before the banner, not uvicorn's own

    os.environ["STREAMRES_PROXY_CONFIG"] = os.path.abspath(config_path)
    os.environ["STREAMRES_PROXY_REDIS"] = redis or ""
    print(
        f"streamres proxy on http://{host}:{port} — {workers} workers"
        + (f", sharing state through {redact_url(redis)}" if redis else " (state per worker)"),
        flush=True,
    )
    uvicorn.run(
        "streamres.proxy.server.serve:worker_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        lifespan="on",
        log_level="warning",
        access_log=False,
        **_server_settings(limits),
        http="streamres.proxy.server.connections:Guarded",  # each worker sets its limits at startup
        loop="uvloop" if event_loop(loop)["use_uvloop"] else "asyncio",
    )


def _can_listen(host: str, port: int) -> None:
    """``OSError`` if nothing could listen on ``host:port`` now (in use, or not this host's).
    Bound as uvicorn binds (``SO_REUSEADDR``), so only a port another server holds fails."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))


def _freeze() -> None:
    """A proxy process has started: what it holds now (modules, the client, the encodings) it
    holds for good, so the garbage collector stops walking it: a full collection over those
    54,000 objects held up every answer in flight for 12–18 ms (after the freeze, under 1 ms)."""
    gc.collect()
    gc.freeze()


def _server_settings(limits: ServerLimits) -> dict[str, Any]:
    """uvicorn's own settings for ``limits`` (the rest is :mod:`.connections`)."""
    return {
        # The app counts requests at once itself and turns away only the excess (uvicorn's
        # limit refuses every request while the open connections are past it).
        "limit_concurrency": None,
        "timeout_keep_alive": limits.idle_timeout,
        "timeout_graceful_shutdown": limits.grace,
        "backlog": _backlog(limits.connections),
    }


def _backlog(connections: int) -> int:
    """The listen queue: as long as the kernel allows (``net.core.somaxconn``), up to the
    connection limit. uvicorn's 2,048 drops the SYNs of a larger burst, which the clients send
    again only 1, 3, 7 s later."""
    try:
        with open("/proc/sys/net/core/somaxconn") as f:
            most = int(f.read())
    except (OSError, ValueError):  # not Linux: what the platform caps it to anyway
        most = 4096
    return max(128, min(connections, most))


def _open_files(limits: ServerLimits) -> ServerLimits:
    """Raise this process's open-file limit to what ``limits.connections`` need (two sockets
    per answer: the client's and the upstream's), as far as the hard limit allows; past that,
    the limits with as many connections as the files allow (said once, in the log)."""
    try:
        import resource
    except ImportError:  # not on this platform
        return limits
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 2 * limits.connections + 256
    if soft == resource.RLIM_INFINITY or soft >= want:
        return limits
    new = want if hard == resource.RLIM_INFINITY else min(want, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    except (ValueError, OSError):
        new = soft
    if new >= want:
        return limits
    fits = max(1, (new - 256) // 2)
    log.warning(
        "streamres.proxy_open_files",
        connections=fits,
        configured=limits.connections,
        open_files=new,
        hint="the open-file limit (ulimit -n) allows two files per connection for this many; "
        "raise the hard limit for more",
    )
    return dataclasses.replace(limits, connections=fits)


def _listening(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host``:``port`` (the server listens on it). Made with its
    protocol named (``IPPROTO_TCP``): asyncio turns Nagle's algorithm off (``TCP_NODELAY``)
    only on connections whose socket says TCP, and without it every response on a kept-alive
    connection waited some 40 ms for the client's delayed ACK between its head and its body."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


@dataclass
class Running:
    url: str
    proxy: Proxy
    upstream: Upstream | None
    server: object
    #: Set when the server has stopped (SIGINT/SIGTERM, or the block ended).
    stopped: anyio.Event


@contextlib.asynccontextmanager
async def running(
    config: Config | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8787,
    faults: str = "storm",
    token_delay: float = 0.02,
    server: str = "uvicorn",
    redis: str | None = None,
    answers: HoldLimits | None = None,
) -> AsyncIterator[Running]:
    """The proxy serving in this event loop until the block ends (tests, embedding).
    ``server``: "uvicorn" (the default, measured faster) or "hypercorn"; ``redis``: share
    limits and model state with other proxies (and workers) through it; ``answers``: how
    answers are held for readers that go (``[answers]``; by default the config's)."""
    require_server(server)
    models = embedded_models(faults) if config is None else {}
    async with contextlib.AsyncExitStack() as stack:
        up = None
        if config is None:
            up = await stack.enter_async_context(
                Upstream(models=models, token_delay=token_delay, ping_interval=0.5)
            )
            config = embedded_config(up)
        if answers is not None:
            config = dataclasses.replace(config, answers=answers)
        app = await stack.enter_async_context(_proxy_app(config, redis))
        limits = _open_files(config.server)
        runner = (
            _Uvicorn(app, host, port, limits)
            if server == "uvicorn"
            else _Hypercorn(app, host, port, limits)
        )
        stopped = anyio.Event()

        async def serve_then_flag() -> None:
            try:
                await runner.serve()
            finally:
                stopped.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(serve_then_flag)
            bound = await runner.started()
            try:
                yield Running(f"http://{host}:{bound}", app, up, runner, stopped)
            finally:
                runner.should_exit = True
                # Its shutdown runs to the end even when the block failed (the task group
                # would cancel it half-way, and its listening socket be left to the GC).
                with anyio.CancelScope(shield=True), anyio.move_on_after(limits.grace + 5):
                    await stopped.wait()


class _Uvicorn:
    def __init__(self, app: Proxy, host: str, port: int, limits: ServerLimits) -> None:
        import uvicorn

        from streamres.proxy.server.connections import guarded

        self.server = uvicorn.Server(
            uvicorn.Config(
                app,
                host=host,
                port=port,
                lifespan="off",
                log_level="warning",
                access_log=False,
                http=guarded(limits),
                **_server_settings(limits),
            )
        )
        # Bound here, before anything serves: a port in use is an OSError the caller words
        # in one line (uvicorn, binding it itself, logs its own and ends the process with 3).
        self.socket = _listening(host, port)

    @property
    def should_exit(self) -> bool:
        return bool(self.server.should_exit)

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self.server.should_exit = value

    async def serve(self) -> None:
        await self.server.serve(sockets=[self.socket])

    async def started(self) -> int:
        while not self.server.started:
            if self.server.should_exit:
                raise OSError("the proxy could not listen")
            await anyio.sleep(0.01)
        return int(self.server.servers[0].sockets[0].getsockname()[1])


class _Hypercorn:
    def __init__(self, app: Proxy, host: str, port: int, limits: ServerLimits) -> None:
        from hypercorn.config import Config as HConfig

        self.app = app
        self.config = HConfig()
        self.config.bind = [f"{host}:{port}"]
        # hypercorn's nearest settings (the head and write limits are uvicorn's, above).
        self.config.graceful_timeout = limits.grace
        self.config.keep_alive_timeout = limits.idle_timeout
        self.config.h11_max_incomplete_size = limits.header_bytes
        self.config.accesslog = None
        self.config.loglevel = "WARNING"
        self._stop = anyio.Event()
        self._bound: list[int] = []
        self._ready = anyio.Event()

    @property
    def should_exit(self) -> bool:
        return self._stop.is_set()

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        if value:
            self._stop.set()

    async def serve(self) -> None:
        import socket

        from hypercorn.asyncio import serve as hserve

        # Bind here to learn the port (hypercorn binds from config.bind otherwise).
        host, port = self.config.bind[0].rsplit(":", 1)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, int(port)))
        sock.listen(1024)
        sock.set_inheritable(True)
        self._bound.append(sock.getsockname()[1])
        # hypercorn makes a socket of its own on the descriptor and closes it: it gets a
        # duplicate, and this one is closed here (two owners of one descriptor would close
        # it twice, or leave one to the garbage collector).
        self.config.bind = [f"fd://{os.dup(sock.fileno())}"]
        self._ready.set()
        try:
            await hserve(self.app, self.config, shutdown_trigger=self._stop.wait)  # type: ignore[arg-type]
        finally:
            sock.close()

    async def started(self) -> int:
        await self._ready.wait()
        return self._bound[0]


async def serve(
    config: Config | None,
    host: str,
    port: int,
    faults: str,
    server: str = "uvicorn",
    redis: str | None = None,
) -> None:
    """``streamres proxy``: serve until interrupted."""
    async with running(
        config, host=host, port=port, faults=faults, server=server, redis=redis
    ) as run:
        _freeze()
        target = (
            f"the embedded upstream (models {', '.join(run.proxy.config.models)}; faults: {faults})"
            if run.upstream is not None
            else ", ".join(run.proxy.config.models)
        )
        print(
            f"streamres proxy on {run.url} — OpenAI base_url {run.url}/v1, Anthropic base_url "
            f"{run.url}; health board {run.url}/ ; chat page {run.url}/chat ; serving {target}",
            flush=True,
        )
        shared = run.proxy.client.shared_status()
        if shared is not None and not shared.connected:
            print(
                f"streamres proxy: shared state at {shared.url} is not answering: limits, "
                "breakers and cool-downs are this process's own until it does (see /health)",
                file=sys.stderr,
                flush=True,
            )
        await run.stopped.wait()
