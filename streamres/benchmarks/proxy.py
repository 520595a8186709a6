"""``streamres bench proxy``: what the proxy adds, against going straight to the upstream.

Every server in its own process on loopback (the embedded upstream; the proxy under uvicorn,
and under hypercorn for comparison; LiteLLM's proxy when it is installed), clients here:

- latency per token: the upstream writes each token (one flushed write each, 5 ms apart) as
  the time it wrote it, so each token's latency is measured at the client — straight, then
  through the proxy — and the proxy's addition is the difference of the distributions;
- CPU per 1,000 events relayed: the proxy process's CPU time for a fast stream (one event per
  write), next to what one bare httpx-sse client spends reading the same stream directly;
- fan-out: N concurrent slow streams through one proxy process — every answer exact, the
  proxy's peak RSS and CPU;
- mid-stream faults through each proxy: is the answer the client gets the upstream's text?
- per request: the time to the first token and to the whole answer (p50, p99) of short
  answers at full speed, at 1, 4, 16 and 64 requests at once, over one kept-alive client per
  path — straight, through a bare relay (``benchmarks/relay``: bytes passed on, nothing read) and
  through each proxy, all in the same run, taking turns (``ROUNDS``). The relay and the proxy
  run on the same event loop
  (uvloop where it is installed, as uvicorn and ``streamres proxy`` pick it); with uvloop, the
  proxy once more on asyncio's own loop (``--loop asyncio``), to show what the loop is worth.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import httpx

from streamres import MissingExtra
from streamres._shell.apps import install_hint, installed, require
from streamres.benchmarks.common import summary
from streamres.benchmarks.table import table
from streamres.upstream import answer_for

__all__ = ["main"]

Q = [{"role": "user", "content": "Explain TCP slow start."}]
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_KEY = "sk-bench-local-only"


@contextlib.contextmanager
def _process(
    argv: list[str], marker: str, env: dict[str, str] | None = None
) -> Iterator[tuple[str, int]]:
    """A server process; yields (the URL it printed, its pid)."""
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        while True:
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"{argv[:4]} exited before it served")
            if marker in line:
                url = next(w for w in line.split() if w.startswith("http://"))
                yield url.rstrip("/"), proc.pid
                return
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def _upstream(*extra: str) -> contextlib.AbstractContextManager[tuple[str, int]]:
    return _process(
        [sys.executable, "-m", "streamres", "serve", "--port", "0", *extra], "embedded upstream"
    )


@contextlib.contextmanager
def _proxy(upstream: str, server: str = "uvicorn", loop: str = "auto") -> Iterator[tuple[str, int]]:
    """A proxy process in front of ``upstream``: streamres (under uvicorn or hypercorn, on
    ``loop``), or LiteLLM's (``server="litellm"``)."""
    if server in ("litellm", "portkey"):
        with (_litellm_proxy if server == "litellm" else _portkey_proxy)(upstream) as got:
            yield got
        return
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(
            '[policy]\ndeadline = 300\n\n[[routes]]\nname = "m"\nmodel = "m"\n'
            f'base_url = "{upstream}/v1"\n'
        )
        path = f.name
    try:
        with _process(
            [
                sys.executable,
                "-m",
                "streamres",
                "proxy",
                "--port",
                "0",
                "--config",
                path,
                "--server",
                server,
                "--loop",
                loop,
            ],
            "streamres proxy on",
        ) as got:
            yield got
    finally:
        os.unlink(path)


@contextlib.contextmanager
def _litellm_proxy(upstream: str) -> Iterator[tuple[str, int]]:
    exe = _litellm()
    assert exe is not None
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(
            "model_list:\n  - model_name: m\n    litellm_params:\n      model: openai/m\n"
            f"      api_base: {upstream}/v1\n      api_key: x\n"
        )
        path = f.name
    port = _free_port()
    argv = [exe, "--config", path, "--port", str(port), "--host", "127.0.0.1"]
    # Its model price list from the package, not fetched from GitHub at start.
    env = {**os.environ, "LITELLM_MASTER_KEY": _KEY, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}

    def ready(url: str) -> bool:
        try:
            return httpx.get(url + "/health/liveliness", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        with _gateway(argv, port, "LiteLLM's proxy", ready, 120, env=env) as got:
            yield got
    finally:
        os.unlink(path)


def _free_port() -> int:
    """A free loopback port, for a server that cannot report the one it took."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@contextlib.contextmanager
def _gateway(
    argv: list[str],
    port: int,
    what: str,
    ready: Callable[[str], bool],
    seconds: float,
    **popen: Any,
) -> Iterator[tuple[str, int]]:
    """Another gateway's server process on ``port``, once ``ready`` says it serves (within
    ``seconds``); stopped when the block ends."""
    popen.setdefault("stdout", subprocess.DEVNULL)
    popen.setdefault("stderr", subprocess.DEVNULL)
    proc = subprocess.Popen(argv, **popen)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited at start (code {proc.returncode})")
            if ready(url):
                break
            time.sleep(0.2)
        yield url, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _servers() -> list[str]:
    """The proxies this run can start: streamres's under each installed server, LiteLLM's
    when its command is here, Portkey's gateway when it is here and answers (``not_run``
    says why any other is not)."""
    servers = ["uvicorn"] + (["hypercorn"] if installed("hypercorn") else [])
    return servers + (["litellm"] if _litellm() else []) + (["portkey"] if _PORTKEY.ok else [])


#: Headers a gateway needs on each request: Portkey's names the provider and the upstream.
_HEADERS: dict[str, dict[str, str]] = {}


class _Portkey:
    """Portkey's gateway (``@portkey-ai/gateway`` on Node): where its start script is
    (``STREAMRES_PORTKEY``, else ``node_modules`` here), and why it cannot run, once tried."""

    def __init__(self) -> None:
        self.why: str | None = None
        self.ok = False

    @property
    def script(self) -> str | None:
        given = os.environ.get("STREAMRES_PORTKEY") or os.path.join(
            "node_modules", "@portkey-ai", "gateway", "build", "start-server.js"
        )
        return given if os.path.exists(given) and shutil.which("node") else None

    async def probe(self, upstream: str) -> None:
        """Start it once and ask it for an answer: it runs in the rows only if it answers."""
        if self.script is None:
            self.why = (
                "Portkey's gateway: not here (npm install @portkey-ai/gateway, or name its "
                "build/start-server.js with STREAMRES_PORTKEY; Node needed)"
            )
            return
        with tempfile.TemporaryFile("w+") as said, _portkey_proxy(upstream, said) as (url, _):
            try:
                got = await _read(url, 20)
            except httpx.HTTPError:
                body = {"model": "m", "messages": Q, "stream": True}
                async with httpx.AsyncClient() as http:
                    r = await http.post(
                        url + "/v1/chat/completions", json=body, headers=_HEADERS[url]
                    )
                got = f"HTTP {r.status_code} {r.text[:80]}"
            self.ok = got == answer_for(Q, words=20)
            if not self.ok:
                said.seek(0)
                said_lines = [re.search(r"\w*Error: .*", x) for x in said]
                error = next((m.group(0)[:100] for m in said_lines if m), "no error logged")
                self.why = f"Portkey's gateway: every answer failed ({got}; its log: {error})"


_PORTKEY = _Portkey()


@contextlib.contextmanager
def _portkey_proxy(upstream: str, said: Any = subprocess.DEVNULL) -> Iterator[tuple[str, int]]:
    """Portkey's gateway in front of ``upstream`` (``said``: where its output goes)."""
    assert _PORTKEY.script is not None
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    _HEADERS[url] = {"x-portkey-provider": "openai", "x-portkey-custom-host": upstream + "/v1"}

    def ready(_: str) -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return True
        return False

    argv = ["node", _PORTKEY.script, f"--port={port}", "--headless"]
    env = {**os.environ, "NODE_ENV": "production"}
    output = {"stdout": said, "stderr": said, "env": env}
    with _gateway(argv, port, "Portkey's gateway", ready, 60, **output) as got:
        yield got


def not_run() -> list[str]:
    """Each proxy whose rows this run leaves out, and what would bring it."""
    missing = []
    if not installed("hypercorn"):
        missing.append(
            f"streamres proxy (hypercorn): hypercorn is not installed: {install_hint('hypercorn')}"
        )
    if not _litellm():
        missing.append(
            "LiteLLM proxy: no litellm command on PATH (pip install 'litellm[proxy]', or name "
            "one with STREAMRES_LITELLM)"
        )
    if _PORTKEY.why:
        missing.append(_PORTKEY.why)
    return missing


def _label(server: str) -> str:
    if server == "portkey":
        return "Portkey gateway"
    return "LiteLLM proxy" if server == "litellm" else f"streamres proxy ({server})"


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _peak_rss_mib(pid: int, field: str = "VmHWM") -> float:
    """A process's peak RSS (``field="VmRSS"``: its RSS now), in MiB."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(f"{field}:"):
                return float(line.split()[1]) / 1024
    return 0.0


async def _read(url: str, words: int, stamps: list[float] | None = None) -> str:
    """One streamed answer read with httpx-sse + json.loads; with ``stamps``, each token's
    latency (arrival minus the time the upstream wrote it) is appended."""
    from httpx_sse import aconnect_sse

    text: list[str] = []
    body = {"model": "m", "messages": Q, "stream": True}
    # LiteLLM's proxy requires a key (its master key); the streamres proxy takes none here.
    headers = {"x-upstream-words": str(words), "authorization": f"Bearer {_KEY}"}
    headers.update(_HEADERS.get(url, {}))
    async with (
        httpx.AsyncClient(timeout=None) as client,
        aconnect_sse(
            client, "POST", url + "/v1/chat/completions", json=body, headers=headers
        ) as source,
    ):
        async for sse in source.aiter_sse():
            if sse.data == "[DONE]":
                break
            chunk = json.loads(sse.data)
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content") or ""
                if piece and stamps is not None:
                    stamps.append(time.monotonic() - float(piece))
                text.append(piece)
    return "".join(text)


def _q(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1e3


async def _latency(runs: int, words: int) -> list[dict[str, Any]]:
    rows = []
    with _upstream("--token-delay", "0.005", "--stamp", "--words", str(words)) as (up, _):
        direct: list[float] = []
        for _ in range(runs):
            await _read(up, words, direct)
        rows.append(
            {
                "path": "straight to the upstream",
                "p50_ms": _q(direct, 0.5),
                "p99_ms": _q(direct, 0.99),
            }
        )
        for server in _servers():
            with _proxy(up, server) as (url, _pid):
                await _read(url, 20)  # warm
                got: list[float] = []
                for _ in range(runs):
                    await _read(url, words, got)
            rows.append(
                {
                    "path": f"through {_label(server)}",
                    "p50_ms": _q(got, 0.5),
                    "p99_ms": _q(got, 0.99),
                    "added_p50_ms": _q(got, 0.5) - _q(direct, 0.5),
                    "added_p99_ms": _q(got, 0.99) - _q(direct, 0.99),
                }
            )
    return rows


async def _cpu(words: int) -> list[dict[str, Any]]:
    rows = []
    with _upstream("--framing", "event", "--words", str(words)) as (up, _):
        want = answer_for(Q, words=words)
        await _read(up, words)
        c = time.process_time()
        assert await _read(up, words) == want
        client = time.process_time() - c
        events = len(want.split(" "))
        rows.append(
            {
                "reader": "one bare httpx-sse client",
                "cpu_ms_per_1000_events": client / events * 1e6,
                "ratio": 1.0,
            }
        )
        for server in _servers():
            with _proxy(up, server) as (url, pid):
                await _read(url, words)
                before = _cpu_seconds(pid)
                got = await _read(url, words)
                used = _cpu_seconds(pid) - before
            if got != want:
                rows.append({"reader": f"{_label(server)} relaying", "note": "inexact answer"})
                continue
            rows.append(
                {
                    "reader": f"{_label(server)} relaying",
                    "cpu_ms_per_1000_events": used / events * 1e6,
                    "ratio": used / client,
                }
            )
    return rows


async def _fanout(streams: int, words: int) -> dict[str, Any]:
    with (
        _upstream("--token-delay", "0.02", "--words", str(words)) as (up, _),
        _proxy(up) as (
            url,
            pid,
        ),
    ):
        want = answer_for(Q, words=words)
        results: list[bool] = []
        before = _cpu_seconds(pid)
        started = time.perf_counter()

        async def one() -> None:
            try:
                results.append(await _read(url, words) == want)
            except httpx.HTTPError:
                results.append(False)

        async with anyio.create_task_group() as tg:
            for _ in range(streams):
                tg.start_soon(one)
        return {
            "streams": streams,
            "exact": sum(results),
            "wall_s": time.perf_counter() - started,
            "proxy_cpu_s": _cpu_seconds(pid) - before,
            "proxy_peak_rss_mib": _peak_rss_mib(pid),
        }


def _litellm() -> str | None:
    exe = os.environ.get("STREAMRES_LITELLM") or shutil.which("litellm")
    return exe


async def _faults_through(words: int) -> list[dict[str, Any]]:
    """An in-band error after 20 tokens and a reset after 40: what each proxy's client gets."""
    rows = []
    want = answer_for(Q, words=words)
    for server in [s for s in _servers() if s != "hypercorn"]:
        # A fresh upstream for each: the faults are the first requests'.
        with _upstream("--faults", "error@20,reset@40", "--words", str(words)) as (up, _):
            with _proxy(up, server) as (url, _pid):
                try:
                    got = await _read(url, words)
                    outcome = (
                        "exact" if got == want else f"inexact: {len(got)} of {len(want)} characters"
                    )
                except httpx.HTTPError as exc:
                    outcome = f"failed: {type(exc).__name__}"
            rows.append({"proxy": _label(server), "client_got": outcome})
    return rows


def _relay(upstream: str) -> contextlib.AbstractContextManager[tuple[str, int]]:
    argv = [sys.executable, "-m", "streamres.benchmarks.relay", upstream]
    return _process(argv, "bare relay on")


def _text_of(raw: bytes) -> str:
    """The answer's text in a Chat Completions SSE body."""
    text = []
    for line in raw.decode("utf-8").splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:]).get("choices") or []:
                text.append((choice.get("delta") or {}).get("content") or "")
    return "".join(text)


async def _timed(
    client: httpx.AsyncClient, url: str, concurrency: int, requests: int, words: int
) -> tuple[list[float], list[float], list[bytes]]:
    """``requests`` answers, ``concurrency`` at a time over ``client`` (kept alive): each one's
    seconds to its first token and to its end, and its body."""
    body = {"model": "m", "messages": Q, "stream": True}
    headers = {"x-upstream-words": str(words), "authorization": f"Bearer {_KEY}"}
    headers.update(_HEADERS.get(url, {}))
    first: list[float] = []
    total: list[float] = []
    bodies: list[bytes] = []
    left = requests

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            for tries_left in range(concurrency, -1, -1):
                t0 = time.perf_counter()
                got, seen = b"", None
                try:
                    async with client.stream(
                        "POST", url + "/v1/chat/completions", json=body, headers=headers
                    ) as r:
                        async for chunk in r.aiter_raw():
                            got += chunk
                            if seen is None and b'"content":"' in got.replace(b'"content":""', b""):
                                seen = time.perf_counter() - t0
                    break
                except httpx.TransportError:
                    # A kept-alive connection the server closed as it was reused (a race
                    # with its idle timeout): not the path's cost; asked again on a new one.
                    if got or not tries_left:
                        raise
            total.append(time.perf_counter() - t0)
            first.append(seen if seen is not None else total[-1])
            bodies.append(got)

    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(worker)
    return first, total, bodies


#: Rounds the per-request measurement takes its requests in: each round runs a share of every
#: path's requests, the paths in turn (the order rotating), so that a machine that speeds up or
#: slows down during the run moves every path alike, not the one measured at that moment.
ROUNDS = 10


#: Requests at once, as the gateways' published benchmarks measure them.
CONCURRENCY = (1, 4, 16, 64)


async def _per_request(
    requests: int, words: int, concurrency_levels: tuple[int, ...] = CONCURRENCY
) -> list[dict[str, Any]]:
    """Per request, at each concurrency: straight, through a bare relay, through each proxy —
    the time to the first token and to the end, what each adds to going straight (p50 and
    p99), and that as a multiple of what the bare relay adds in the same run. Every server runs
    through the whole measurement; the paths take turns (``ROUNDS``)."""
    rows: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        up, _ = stack.enter_context(_upstream("--token-delay", "0", "--words", str(words)))
        want = answer_for(Q, words=words)
        starts: list[tuple[str, Any]] = [
            ("straight to the upstream", lambda: contextlib.nullcontext((up, 0))),
            ("bare relay", lambda: _relay(up)),
            *((_label(s), lambda s=s: _proxy(up, s)) for s in _servers()),
        ]
        if installed("uvloop"):  # what the event loop is worth: the proxy on asyncio's own
            label = "streamres proxy (uvicorn, asyncio loop)"
            starts.insert(3, (label, lambda: _proxy(up, "uvicorn", "asyncio")))
        paths = [(label, stack.enter_context(start())[0]) for label, start in starts]
        for concurrency in concurrency_levels:
            # Idle connections dropped after 2 s, before any server's own idle timeout (uvicorn
            # closes them after 5): none is reused as the server closes it.
            limits = httpx.Limits(
                max_connections=concurrency,
                max_keepalive_connections=concurrency,
                keepalive_expiry=2.0,
            )
            async with contextlib.AsyncExitStack() as open_clients:
                clients = [
                    await open_clients.enter_async_context(
                        httpx.AsyncClient(timeout=60, limits=limits)
                    )
                    for _ in paths
                ]
                got: list[tuple[list[float], list[float], list[bytes]]] = [
                    ([], [], []) for _ in paths
                ]
                for client, (_, url) in zip(clients, paths, strict=True):
                    await _timed(client, url, concurrency, 10, words)  # warm: connections
                for turn in range(ROUNDS):
                    share = requests // ROUNDS + (turn < requests % ROUNDS)
                    for i in [(turn + k) % len(paths) for k in range(len(paths))]:
                        # Its connections used again first, untimed: servers close idle ones
                        # (uvicorn after 5 s) while the other paths take their turns.
                        await _timed(clients[i], paths[i][1], concurrency, concurrency, words)
                        first, total, bodies = await _timed(
                            clients[i], paths[i][1], concurrency, share, words
                        )
                        got[i][0].extend(first)
                        got[i][1].extend(total)
                        got[i][2].extend(bodies)
            for (label, _), (first, total, bodies) in zip(paths, got, strict=True):
                rows.append(
                    {
                        "path": label,
                        "concurrency": concurrency,
                        "requests": len(total),
                        "exact": sum(_text_of(b) == want for b in bodies),
                        "first_p50_ms": _q(first, 0.5),
                        "first_p99_ms": _q(first, 0.99),
                        "total_p50_ms": _q(total, 0.5),
                        "total_p99_ms": _q(total, 0.99),
                    }
                )
    base = {r["concurrency"]: r for r in rows if r["path"] == "straight to the upstream"}
    for r in rows:
        b = base[r["concurrency"]]
        for k in ("first_p50_ms", "first_p99_ms", "total_p50_ms", "total_p99_ms"):
            r["added_" + k] = r[k] - b[k]
    relay = {r["concurrency"]: r for r in rows if r["path"] == "bare relay"}
    for r in rows:
        for q in ("p50", "p99"):
            floor = relay[r["concurrency"]][f"added_total_{q}_ms"]
            r[f"x_relay_{q}"] = r[f"added_total_{q}_ms"] / floor if floor > 0 else float("nan")
    return rows


async def _all(args: argparse.Namespace) -> dict[str, Any]:
    quick = args.quick
    report: dict[str, Any] = {}
    with _upstream("--words", "20") as (up, _):
        await _PORTKEY.probe(up)
    print("latency per token…", file=sys.stderr)
    report["latency"] = await _latency(1 if quick else 5, 60 if quick else 200)
    print("CPU per event…", file=sys.stderr)
    report["cpu"] = await _cpu(200 if quick else 4000)
    print(f"{args.streams} concurrent streams…", file=sys.stderr)
    report["fanout"] = await _fanout(20 if quick else args.streams, 40)
    print("mid-stream faults…", file=sys.stderr)
    report["faults"] = await _faults_through(60)
    print("per request…", file=sys.stderr)
    levels = tuple(int(c) for c in str(args.concurrency).split(",") if c.strip())
    report["requests"] = await _per_request(
        50 if quick else args.requests, 20, levels[:2] if quick else levels
    )
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="streamres bench proxy", description=summary(__doc__))
    p.add_argument("--quick", action="store_true", help="small sizes, one run (a smoke test)")
    p.add_argument("--streams", type=int, default=1000, help="concurrent streams in the fan-out")
    p.add_argument(
        "--requests", type=int, default=500, help="requests per path and concurrency, per request"
    )
    p.add_argument(
        "--concurrency",
        default=",".join(map(str, CONCURRENCY)),
        help="requests at once in the per-request part, comma-separated",
    )
    p.add_argument("--json", default="bench-proxy.json", help="where to write the results")
    args = p.parse_args(argv)
    try:  # what every row needs: one line, before anything starts
        require("httpx_sse", "streamres bench proxy (its direct reader)")
        require("uvicorn", "streamres bench proxy")
    except MissingExtra as exc:
        print(f"streamres bench proxy: {exc}", file=sys.stderr)
        return 2
    report = anyio.run(_all, args)
    report["not_run"] = not_run()
    print("\nLatency per token (ms; the upstream writes one token every 5 ms)")
    print(table(report["latency"]))
    print("\nCPU per 1,000 events")
    print(table(report["cpu"]))
    print("\nFan-out")
    print(table([report["fanout"]]))
    print("\nMid-stream faults (error@20, reset@40): what the client got")
    print(table(report["faults"]))
    print("\nPer request (ms; 20-word answers at full speed, over one kept-alive client)")
    print(
        table(
            report["requests"],
            [
                "path",
                "concurrency",
                "exact",
                "first_p50_ms",
                "first_p99_ms",
                "total_p50_ms",
                "total_p99_ms",
                "added_first_p50_ms",
                "added_total_p50_ms",
                "added_total_p99_ms",
                "x_relay_p50",
                "x_relay_p99",
            ],
        )
    )
    for row in report["not_run"]:
        print(f"not run: {row}")
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    print(f"\nwritten to {args.json}")
    fan = report["fanout"]
    whole = all(r["exact"] == r["requests"] for r in report["requests"])
    return 0 if fan["exact"] == fan["streams"] and whole else 1
