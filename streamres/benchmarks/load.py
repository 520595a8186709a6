"""``streamres bench load`` (also ``--load``): many streams at once, through one ``Client`` and
through one proxy process, against a healthy upstream and through a fault storm.

The embedded upstream runs in its own process (answers of ``--words`` words, ``--token-delay``
seconds apart: about 2.5 s each); each size of ``--sizes`` starts that many streams at once,
with the default settings (a ``Client`` as it comes; ``streamres proxy`` with its defaults)
but one deadline for every answer on both paths (``--deadline``, 300 s), and counts the
answers that are exactly the upstream's. The storm: the upstream refuses 2 % of connections
and breaks 20 % of the streams mid-way (``--chaos 0.02,0.2,0``, seeded), which every answer
must survive. Reported per run: exact answers, wall time, CPU seconds (this
process for a ``Client``; the proxy process for the proxy) and per stream, peak RSS and per
stream, the breaker's openings and the attempts that failed on the client's side; through a
``Client``, the connects that waited for room in the server's connect window (the connect pace)
and the most that were ever in progress at once.

Through the proxy, a request turned away (503 with ``Retry-After``: past ``[server]
connections`` only the excess is) is tried again after it, as the official SDKs do, and counted
(``retried_503``); ``--connections N`` sets the proxy's limit, raising the open-file limit (two
a stream) where this process may.

``--busy N`` starts N processes that only burn CPU for the length of each run: a machine
starved of CPU (more work than cores), where the client's event loop runs late and a burst's
connects are seen to complete late.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import json
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import httpx

import streamres
from streamres._shell.stream import POOLS
from streamres.benchmarks.common import summary
from streamres.benchmarks.proxy import _cpu_seconds, _peak_rss_mib, _process
from streamres.benchmarks.table import table
from streamres.upstream import answer_for

__all__ = ["main"]

Q = [{"role": "user", "content": "Explain TCP slow start."}]
STORM = "0.02,0.2,0"
#: Tries a client gives a request the proxy turned away (503, Retry-After), as the official
#: SDKs try again (they default to 2 more; a burst past the proxy's limit needs a few).
RETRIES = 8


def _room_for(connections: int) -> None:
    """Raise this process's open-file limit (which the servers it starts inherit) to what
    ``connections`` streams need in the proxy: one socket to the client and one upstream
    each. Past the hard limit it takes privileges (root); without, the proxy says what
    fits."""
    want = 2 * connections + 512
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), max(hard, want)))


def _upstream(words: int, delay: float, chaos: str | None) -> Any:
    argv = [sys.executable, "-m", "streamres", "serve", "--port", "0", "--words", str(words)]
    argv += ["--token-delay", str(delay), "--seed", "7"]
    if chaos:
        argv += ["--chaos", chaos]
    return _process(argv, "embedded upstream")


def _proxy(upstream: str, deadline: float, connections: int | None = None) -> Any:
    f = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)  # noqa: SIM115
    with f:
        f.write(f"[policy]\ndeadline = {deadline}\n")
        if connections is not None:
            f.write(f"[server]\nconnections = {connections}\n")
        f.write(f'[[routes]]\nname = "m"\nmodel = "m"\nbase_url = "{upstream}/v1"\n')
    argv = [sys.executable, "-m", "streamres", "proxy", "--port", "0", "--config", f.name]
    return _process(argv, "streamres proxy on")


async def _exact(
    n: int, answer: Callable[[], Awaitable[str]], expected: str
) -> tuple[int, dict[str, int]]:
    """``n`` answers at once: how many are exactly ``expected``, and why the others are not
    (``answer`` returns the text, or why there is none)."""
    exact = 0
    others: collections.Counter[str] = collections.Counter()

    async def one() -> None:
        nonlocal exact
        got = await answer()  # awaited first: ``exact +=`` would read it before
        if got == expected:
            exact += 1
        else:
            others[got if got.startswith("!") else "!different text"] += 1

    async with anyio.create_task_group() as tg:
        for _ in range(n):
            tg.start_soon(one)
    return exact, dict(others)


async def _through_client(url: str, n: int, expected: str, deadline: float) -> dict[str, Any]:
    route = streamres.Route("m", base_url=f"{url}/v1", api_key="k")
    cpu0, t0 = time.process_time(), time.perf_counter()
    async with streamres.Client([route]) as client:

        async def answer() -> str:
            text = ""
            try:
                async for ev in client.stream(Q, deadline=deadline):
                    if ev.type == "text":
                        text += ev.text
            except streamres.StreamError as exc:
                return f"!{type(exc).__name__}"
            return text

        exact, others = await _exact(n, answer, expected)
        m = client.metrics()["m"]
        paces = client._limits.connects.paces.values() if client._limits is not None else ()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    opened = sum(1 for _, state in m.breaker_changes if state == "open")
    return {
        "exact": exact,
        "not_exact": others,
        "wall_s": wall,
        "cpu_s": cpu,
        "rss_mib": rss,
        "breaker_opened": opened,
        "client_side": m.client_side_failures,
        "connects_waited": sum(p.waited for p in paces),
        "connects_at_once": max((p.most for p in paces), default=0),
    }


@contextlib.contextmanager
def _busy(n: int) -> Any:
    """``n`` processes that burn CPU until the block ends."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for b in burners:
            b.kill()
            b.wait()


async def _text(r: httpx.Response) -> str:
    """A streamed Chat Completions answer's text (or why there is none: ``!…``)."""
    if r.status_code != 200:
        return f"!HTTP {r.status_code}"
    text = ""
    async for line in r.aiter_lines():
        if line.startswith("data: {"):
            event = json.loads(line[6:])
            if "error" in event:
                return "!in-band error: " + str(event["error"].get("code"))
            choices = event.get("choices") or [{}]
            text += (choices[0].get("delta") or {}).get("content") or ""
    return text


async def _through_proxy(url: str, pid: int, n: int, expected: str) -> dict[str, Any]:
    cpu0, t0 = _cpu_seconds(pid), time.perf_counter()
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    body = {"model": "m", "messages": Q, "stream": True}
    async with contextlib.AsyncExitStack() as stack:
        # The clients' side spread over many pools, as a Client's is (httpcore's pool costs
        # the square of its connections): the load must not be what runs out of CPU first.
        clients = [
            await stack.enter_async_context(httpx.AsyncClient(timeout=300, limits=limits))
            for _ in range(POOLS)
        ]
        turn = itertools.count()
        http = clients[0]

        retried = 0

        async def answer() -> str:
            nonlocal retried
            own = clients[next(turn) % len(clients)]
            try:
                for tried in range(RETRIES):  # a 503 with Retry-After is tried again, as SDKs do
                    async with own.stream("POST", url + "/v1/chat/completions", json=body) as r:
                        again = r.headers.get("retry-after") if r.status_code == 503 else None
                        if again is None or tried == RETRIES - 1:
                            return await _text(r)
                    retried += 1
                    await anyio.sleep(float(again))
            except httpx.HTTPError as exc:
                return f"!{type(exc).__name__}: {exc or exc.__cause__!r}"[:120]
            return "!unreachable"

        exact, others = await _exact(n, answer, expected)
        health = (await http.get(url + "/health")).json()["models"]["m"]
    return {
        "exact": exact,
        "not_exact": others,
        "wall_s": time.perf_counter() - t0,
        "cpu_s": _cpu_seconds(pid) - cpu0,
        "rss_mib": _peak_rss_mib(pid),
        "breaker_opened": sum(1 for c in health["breaker_changes"] if c["state"] == "open"),
        "client_side": health.get("client_side_failures", 0),
        "retried_503": retried,
    }


async def _run(args: argparse.Namespace) -> list[dict[str, Any]]:
    expected = answer_for(Q, words=args.words)
    rows: list[dict[str, Any]] = []
    for faults in args.faults:
        for n in args.sizes:
            for path in args.paths:
                # A fresh upstream (and proxy) per run: one run's connections and breakers
                # are not the next one's.
                with _upstream(
                    args.words, args.token_delay, STORM if faults == "storm" else None
                ) as (
                    up,
                    _,
                ):
                    if path == "client":
                        with _busy(args.busy):
                            got = await _through_client(up, n, expected, args.deadline)
                    else:
                        proxied = _proxy(up, args.deadline, args.connections)
                        with proxied as (proxy, pid), _busy(args.busy):
                            got = await _through_proxy(proxy, pid, n, expected)
                row = {"path": path, "faults": faults, "busy": args.busy, "streams": n, **got}
                row["cpu_ms_per_stream"] = got["cpu_s"] * 1000 / n
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="streamres bench load", description=summary(__doc__))
    p.add_argument("--sizes", type=int, nargs="+", default=[1000, 2000, 5000])
    p.add_argument("--paths", nargs="+", default=["client", "proxy"], choices=["client", "proxy"])
    p.add_argument("--faults", nargs="+", default=["none", "storm"], choices=["none", "storm"])
    p.add_argument("--words", type=int, default=25)
    p.add_argument("--token-delay", type=float, default=0.1)
    p.add_argument(
        "--deadline",
        type=float,
        default=300.0,
        help="each answer's deadline, the same on both paths (default 300 s)",
    )
    p.add_argument(
        "--busy", type=int, default=0, help="processes burning CPU during each run (default 0)"
    )
    p.add_argument(
        "--connections",
        type=int,
        default=None,
        help="the proxy's [server] connections (default: its own, 8,192); the open-file "
        "limit is raised to fit where this process may",
    )
    p.add_argument("--json", default="", help="also write the rows here")
    args = p.parse_args(argv)
    if args.connections:
        _room_for(args.connections)
    rows = anyio.run(_run, args)
    print("Many streams at once (default settings; the upstream in its own process)")
    columns = [
        "path",
        "faults",
        "busy",
        "streams",
        "exact",
        "wall_s",
        "cpu_s",
        "cpu_ms_per_stream",
        "rss_mib",
        "breaker_opened",
        "client_side",
        "connects_waited",
        "connects_at_once",
        "retried_503",
    ]
    print(table(rows, columns))
    for row in rows:
        if row["not_exact"]:
            print(f"  {row['path']} {row['faults']} {row['streams']}: not exact:", row["not_exact"])
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=2)
    return 0
