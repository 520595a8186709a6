"""What the benchmarks share: the question, a ``streamres serve`` in a child process, sizes,
memory readings. Part of ``streamres bench``."""

from __future__ import annotations

import contextlib
import resource
import subprocess
import sys
from collections.abc import Iterator

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
