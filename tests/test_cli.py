"""The streamres command, run as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from streamres.upstream import answer_for

ENV = {k: v for k, v in os.environ.items() if not k.endswith(("_API_KEY", "_BASE_URL"))}


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamres", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
        check=False,
    )


def test_ask_offline_through_a_fault_storm() -> None:
    """`streamres ask` recovers through the storm preset and prints the exact answer."""
    q = "Explain TCP slow start."
    got = run("ask", q, "--token-delay", "0", "--stall-timeout", "0.5")
    assert got.returncode == 0, got.stderr
    expected = answer_for([{"role": "user", "content": q}], words=120)
    assert got.stdout == expected + "\n"
    assert "resuming" in got.stderr
    assert "answer identical to the upstream's text: yes" in got.stderr


def test_ask_failure_keeps_the_partial_and_exits_non_zero() -> None:
    """A refused resume ends with exit code 1, the partial answer still on stdout."""
    got = run("ask", "q", "--faults", "reset@10,401", "--token-delay", "0")
    assert got.returncode == 1
    assert got.stdout.strip()
    assert answer_for([{"role": "user", "content": "q"}], words=120).startswith(got.stdout.strip())
    assert "[failed:" in got.stderr


@pytest.mark.parametrize("bad", ["nonsense@3", "reset@x"])
def test_bad_fault_plan_is_explained(bad: str) -> None:
    """An unknown fault is a usage error with a hint, not a traceback."""
    got = run("ask", "q", "--faults", bad)
    assert got.returncode == 2
    assert "streamres:" in got.stderr
    assert "Traceback" not in got.stderr
