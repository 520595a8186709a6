"""``streamres bench``: throughput, ledger cost, recovery and a chaos soak, measured one way.

The upstream for throughput and the soak runs in its own process (``streamres serve``) so it
is never the bottleneck; every consumer reads the same bytes from it over loopback. Machines
are shared and noisy: each figure is a median of several runs, reported as a ratio to bare
httpx-sse + json.loads measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import time
from typing import Any

import anyio
import structlog

from streamres.benchmarks import dedup as _dedup_bench
from streamres.benchmarks.cache import cache_replay
from streamres.benchmarks.common import server, summary
from streamres.benchmarks.hostile import hostile, probe
from streamres.benchmarks.ledger import ledger
from streamres.benchmarks.recovery import recovery
from streamres.benchmarks.shared_cost import shared_cost
from streamres.benchmarks.soak import soak
from streamres.benchmarks.stalls import stall_detection
from streamres.benchmarks.table import table
from streamres.benchmarks.throughput import first, first_calls, idle_memory, peak_memory, throughput

__all__ = ["main"]


async def _all(args: argparse.Namespace) -> dict[str, Any]:
    sizes = {
        "large chunks": [2000] if args.quick else [20_000, 200_000],
        "one event per write": [2000] if args.quick else [20_000],
        "paced, 1 ms": [300] if args.quick else [2000],
    }
    runs = 1 if args.quick else args.runs
    report: dict[str, Any] = {
        "machine": f"{platform.machine()}, {platform.python_implementation()} "
        f"{platform.python_version()}, {platform.system()}",
    }
    with server() as url:
        print("throughput…", file=sys.stderr)
        report["throughput"] = await throughput(url, sizes, runs)
        report["peak_memory_kib"] = await peak_memory(url, 2000 if args.quick else 20_000)
        print("idle streams…", file=sys.stderr)
        report["idle_stream_kib"] = await idle_memory(url, 20 if args.quick else 200)
        print("first call in a fresh process…", file=sys.stderr)
        report["first_call"] = first_calls(url, 1 if args.quick else 5)
    print("token ledger…", file=sys.stderr)
    report["ledger"] = ledger([1000] if args.quick else [1000, 10_000, 100_000])
    print("recovery…", file=sys.stderr)
    report["recovery"] = await recovery()
    with server("--chaos", "0.5,0.33,0.05", "--ping-interval", "0.2") as url:
        print("chaos soak…", file=sys.stderr)
        report["soak"] = await soak(url, 20 if args.quick else args.soak, 60.0)
    print("hostile upstreams…", file=sys.stderr)
    report["hostile"] = hostile()
    print("de-duplication…", file=sys.stderr)
    report["dedup"] = _dedup_bench.run(60 if args.quick else 400)
    print("stall detection…", file=sys.stderr)
    report["stalls"] = await stall_detection(args.quick)
    print("cache replay…", file=sys.stderr)
    report["cache"] = await cache_replay(40 if args.quick else 120)
    print("semantic cache…", file=sys.stderr)
    report["semantic"] = _semantic()
    print("shared state…", file=sys.stderr)
    report["shared"] = await shared_cost(10 if args.quick else 40)
    return report


_DEDUP_COLUMNS = [
    "language",
    "cases",
    "exact_pct",
    "exact_boundary_2tok_pct",
    "exact_sentence_pct",
    "near_repeats_kept",
    "duplicated_chars",
    "wrongly_dropped_chars",
    "max_new_tokens_held",
    "max_hold_ms_at_50_tok_s",
]


def _print_dedup(rows: list[dict[str, Any]]) -> None:
    print("\nDe-duplication (instruct resumes backing up 0-60 tokens; near-repeats kept)")
    print(table(rows, _DEDUP_COLUMNS))


def _semantic() -> dict[str, Any]:
    from streamres._shell.embedder import bundled_model
    from streamres.benchmarks import semantic as semantic_eval

    started = time.perf_counter()
    model = bundled_model()
    loaded_ms = (time.perf_counter() - started) * 1000
    return {
        "cost": semantic_eval.model_cost(model, loaded_ms),
        "pairs": semantic_eval.evaluate(model, semantic_eval.load_pairs()),
    }


def _print_semantic(report: dict[str, Any]) -> None:
    print("\nSemantic cache: labelled question pairs (precision = right hits / hits)")
    print(
        table(
            report["pairs"],
            ["threshold", "set", "language", "pairs", "precision", "recall", "wrong_hits"],
        )
    )
    print("Bundled model's cost:", report["cost"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="streamres bench", description=summary(__doc__))
    p.add_argument("--quick", action="store_true", help="small sizes, one run (a smoke test)")
    p.add_argument("--runs", type=int, default=5, help="runs per throughput figure (median)")
    p.add_argument("--soak", type=int, default=200, help="concurrent streams in the chaos soak")
    p.add_argument("--json", default="bench-results.json", help="where to write the results")
    p.add_argument(
        "--dedup", action="store_true", help="only the de-duplication benchmark (seconds)"
    )
    p.add_argument(
        "--semantic",
        action="store_true",
        help="only the semantic cache's precision and recall on labelled pairs (seconds)",
    )
    p.add_argument("--probe", help=argparse.SUPPRESS)  # internal: one answer in a child process
    p.add_argument("--first", nargs=2, help=argparse.SUPPRESS)  # internal: a first call
    args = p.parse_args(argv)
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL),
    )
    if args.probe:
        print(json.dumps(anyio.run(probe, args.probe)))
        return 0
    if args.first:
        print(json.dumps(anyio.run(first, *args.first)))
        return 0
    if args.dedup:
        rows = _dedup_bench.run(60 if args.quick else 400)
        _print_dedup(rows)
        return 0 if all(r["wrongly_dropped_chars"] == 0 for r in rows) else 1
    if args.semantic:
        semantic = _semantic()
        _print_semantic(semantic)
        return 0
    report = anyio.run(_all, args)
    print("\nThroughput (client CPU µs per SSE event, median; ratio to httpx-sse + json.loads)")
    print(
        table(
            report["throughput"],
            [
                "framing",
                "provider",
                "events",
                "consumer",
                "cpu_us_per_event",
                "ratio_to_httpx_sse",
                "note",
            ],
        )
    )
    print(
        "Heap per idle open stream (KiB):",
        {k: round(v, 1) for k, v in report["idle_stream_kib"].items()},
    )
    print("\nFirst call in a fresh process (imports excluded; median)")
    print(table(report["first_call"], ["consumer", "ms", "rss_added_mib", "ratio_to_httpx_sse"]))
    print(
        "\nPeak heap per stream (KiB):", {k: round(v) for k, v in report["peak_memory_kib"].items()}
    )
    print("\nToken ledger (µs per event)")
    print(
        table(
            report["ledger"],
            ["events", "ledger_us_per_event", "encode_each_delta_us", "reencode_whole_us"],
        )
    )
    print("\nRecovery (gap = fault detected → next new character, minus the backoff)")
    print(
        table(
            report["recovery"],
            [
                "scenario",
                "gap_ms",
                "held_chars",
                "hold_ms",
                "wasted_tokens",
                "exact",
                "restart_client_wasted",
            ],
        )
    )
    print("\nChaos soak")
    print(table([report["soak"]], list(report["soak"])))
    _print_dedup(report["dedup"])
    print("\nStall detection (default settings: the limit follows the stream's pace)")
    print(table(report["stalls"], ["stream", "stall_to_resume_s"]))
    print(
        "\nA request mix with 30 % repeats (half in other words), 20 at a time, upstream "
        "serving 5 at once"
    )
    print(
        table(
            report["cache"],
            [
                "setup",
                "answers",
                "upstream_requests",
                "capacity_errors",
                "failed_answers",
                "saved",
                "semantic_hits",
                "wrong_answers",
            ],
        )
    )
    _print_semantic(report["semantic"])
    print("\nShared state: what an answer costs (sequential answers, a limit of 8)")
    print(table(report["shared"], ["setup", "ttft_p50_ms", "round_trips_per_answer", "note"]))
    print("\nHostile upstreams (one attempt, client process peak RSS)")
    print(table(report["hostile"], ["attack", "outcome", "seconds", "peak_rss_mib"]))
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    print(f"\nwritten to {args.json}")
    exact = all(r["exact"] for r in report["recovery"])
    return 0 if exact and report["soak"]["exact_or_exact_partial"] == 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
