"""`streamres bench --quick` runs end to end (its timings are not asserted: benchmarks report
them; the test suite times nothing)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys


def test_quick_bench_runs_and_answers_are_exact(tmp_path: pathlib.Path) -> None:
    """The smoke run completes, writes its JSON, and every recovered answer is exact."""
    out = tmp_path / "bench.json"
    env = {k: v for k, v in os.environ.items() if not k.endswith(("_API_KEY", "_BASE_URL"))}
    got = subprocess.run(
        [sys.executable, "-m", "streamres", "bench", "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert got.returncode == 0, got.stdout + got.stderr
    report = json.loads(out.read_text())
    consumers = {r["consumer"] for r in report["throughput"]}
    assert {"streamres", "httpx-sse + json.loads", "httpx aiter_bytes (ceiling)"} <= consumers
    assert all(r["exact"] for r in report["recovery"])
    assert report["soak"]["exact_or_exact_partial"] == 1.0
    assert report["soak"]["completed"] == report["soak"]["streams"]
    assert "Throughput" in got.stdout
