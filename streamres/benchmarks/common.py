"""What the benchmarks share: the question, a ``streamres serve`` in a child process, sizes,
memory readings. Part of ``streamres bench``."""

from __future__ import annotations

import contextlib
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator

import anyio

from streamres.upstream import answer_for, split_tokens

Q = [{"role": "user", "content": "Explain TCP slow start."}]


@contextlib.contextmanager
def server(*extra: str) -> Iterator[str]:
    """``streamres serve`` in a child process; yields its base URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamres", "serve", "--port", "0", *extra],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        url = line.split()[3]  # "embedded upstream on http://127.0.0.1:PORT ..."
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@contextlib.asynccontextmanager
async def redis_server() -> AsyncIterator[str | None]:
    """A local ``redis-server`` on a free loopback port while the block runs; yields its URL
    (``None`` when redis-server is not installed)."""
    exe = shutil.which("redis-server")
    if exe is None:
        yield None
        return
    import coredis

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    command += ["--appendonly", "no", "--dir", tempfile.gettempdir()]
    proc = await anyio.open_process(command, stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        async with coredis.Redis.from_url(url) as r:
            for _ in range(200):  # the server starting
                try:
                    await r.ping()
                    break
                except Exception:
                    await anyio.sleep(0.02)
        yield url
    finally:
        proc.terminate()
        await proc.wait()
        await proc.aclose()


def words_for(events: int) -> int:
    """Answer length (words) that streams about ``events`` deltas."""
    sample = 2000
    per_word = len(split_tokens(answer_for(Q, words=sample))) / sample
    return max(10, round(events / per_word))


def rss_kib() -> float:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return float(line.split()[1])
    except OSError:
        pass
    return 0.0


def peak_rss_kib() -> float:
    """This process's peak RSS. On Linux from VmHWM: ``ru_maxrss`` survives fork and exec, so
    a child started by a big parent would report the parent's peak."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return float(line.split()[1])
    except OSError:
        pass
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def summary(doc: str | None) -> str:
    """A command's ``--help`` description: its module docstring's first paragraph, on one line
    and without reStructuredText's literal quotes (its first line alone may stop mid-sentence)."""
    first = (doc or "").strip().split("\n\n")[0]
    return " ".join(first.split()).replace("``", "")
