"""``streamres batch requests.jsonl -o results.jsonl``: a batch through a resilient client, at
low priority, resumable. Uses the public API (``streamres.run_batch``) and the apps' seam
(``_shell/apps``: the command line's parser, where answers come from).

The progress goes to standard error — a Rich display on a terminal, one plain line per answer
otherwise — and the summary to standard output. Exit code 0 when every request was answered,
1 when any failed or a line was not a request (listed), 2 for a usage error, 130 on Ctrl-C
(the answers so far are saved; the same command finishes the rest).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import anyio
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Column

import streamres
from streamres._shell.apps import (
    DEFAULT_MODELS,
    Parser,
    add_target_arguments,
    offline_refusal,
    plural,
    positive_int,
    real_target,
)
from streamres.chat import embedded

__all__ = ["main", "parser"]


def parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="streamres batch",
        description="Answer every request of a JSON Lines file (one request per line: id, "
        "messages or prompt, model, parameters — or an OpenAI Batch API line) through a "
        "resilient client, at low priority, and append each answer to the results file as it "
        "finishes. Run the same command again after a crash or Ctrl-C: only the requests "
        "without an answer are sent. Without a real service configured, the embedded upstream "
        "answers (offline), through its fault storm.",
    )
    p.add_argument("requests", help="the requests, one JSON object per line")
    p.add_argument("--output", "-o", required=True, help="the results file (JSON Lines, appended)")
    p.add_argument(
        "--errors",
        help="where an OpenAI Batch input's failed requests go, as OpenAI's error file "
        "(default: beside --output, out.jsonl -> out.errors.jsonl)",
    )
    p.add_argument("--config", help="routes.toml (as for streamres proxy): routes, aliases, limits")
    add_target_arguments(p, token_delay=0.0)
    p.add_argument(
        "--concurrency",
        type=positive_int,
        help="answers in flight at most (default: what the routes' limits allow, else 8)",
    )
    p.add_argument(
        "--account-limit",
        type=positive_int,
        help="answers at once on the account (a provider quota), without --config",
    )
    p.add_argument(
        "--priority",
        default="low",
        help="lane for slots: high, normal, low or an integer (higher first)",
    )
    p.add_argument(
        "--when",
        choices=["healthy", "always"],
        default="healthy",
        help="healthy: new work only while a model it may use is not jammed, and the pace "
        "halved on capacity errors; always: as fast as the limits allow",
    )
    p.add_argument("--window", help="start new work only in these local hours, e.g. 22:00-08:00")
    p.add_argument(
        "--redis",
        help="share limits and lanes with other processes (redis://…, redis+cluster://…, redis+sentinel://…)",
    )
    p.add_argument("--seed", type=int, default=0, help="embedded upstream: seed of its storm")
    return p


@contextlib.asynccontextmanager
async def _client(
    args: argparse.Namespace,
) -> AsyncIterator[tuple[streamres.Client, dict[str, list[str]], str | None]]:
    """The client, its model aliases, and the model of lines that name none (the first
    ``--model``; with ``--config`` and no ``--model``, the client picks by weight)."""
    common: dict[str, Any] = {"deadline": args.deadline, "shared": args.redis}
    if args.config:
        from streamres.proxy import load

        config = load(args.config)
        async with streamres.Client(
            **{**config.client_options(), **common, "deadline": args.deadline or config.deadline}
        ) as client:
            yield client, config.models, args.model[0] if args.model else None
        return
    real = real_target(args)
    accounts = {"batch": args.account_limit} if args.account_limit else {}
    if real is not None:
        provider, base_url, api_key = real
        names = args.model or [DEFAULT_MODELS[provider]]
        routes = [
            streamres.Route(
                n,
                provider=provider,
                base_url=base_url,
                api_key=api_key,
                family="chain",
                size=-i,
                account="batch",
            )
            for i, n in enumerate(names)
        ]
        async with streamres.Client(routes, account_limits=accounts, **common) as client:
            yield client, {}, names[0]
        return
    async with (
        embedded(args, account="batch") as (_, routes, _label),
        streamres.Client(
            routes,
            account_limits=accounts,
            backoff=streamres.Backoff(initial=0.2, maximum=2),
            **common,
        ) as client,
    ):
        yield client, {}, routes[0].key


class _Plain:
    """One line per answer and per pause, for logs and pipes."""

    def __init__(self, err: Any) -> None:
        self.err = err
        self.paused = ""
        self.written = 0

    def __call__(self, p: streamres.BatchProgress) -> None:
        if p.paused != self.paused:
            self.paused = p.paused
            print(f"paused: {p.paused}" if p.paused else "resumed", file=self.err, flush=True)
        last = p.last
        if last is None:
            return
        self.written += 1
        n = p.skipped + self.written
        width = len(str(p.total))
        if last.get("ok"):
            tokens = (last.get("usage") or {}).get("output_tokens") or 0
            what = (
                f"ok {last['model']}, {plural(last['attempts'], 'attempt')}, "
                f"{plural(tokens, 'token')}"
            )
        else:
            what = f"FAILED {last.get('error')}: {last.get('message')}"
        print(f"[{n:>{width}}/{p.total}] {last['id']} {what}", file=self.err, flush=True)


#: Columns the progress line keeps whole: "batch", the bar, the count, the time left.
_FIXED = 52


class _Live:
    """A Rich progress display: done of total, in flight, waiting, failed, tokens, rate, ETA."""

    def __init__(self, console: Console, client: streamres.Client) -> None:
        self.client = client
        # The bar, the count and the time left keep their room at any width; the state line
        # takes what is left and is cut with an ellipsis on a narrow terminal (a long one
        # used to push the others out below about 170 columns).
        self.progress = Progress(
            TextColumn("[bold]batch"),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            TextColumn(
                "{task.fields[state]}",
                table_column=Column(
                    no_wrap=True, overflow="ellipsis", max_width=max(12, console.width - _FIXED)
                ),
            ),
            console=console,
            transient=False,
        )
        self.task = self.progress.add_task("batch", total=None, state="")

    def __call__(self, p: streamres.BatchProgress) -> None:
        rate = p.done / p.elapsed if p.elapsed > 0 else 0.0
        health = self.client.health()
        sick = [n for n, h in health.items() if h.status != "healthy"]
        state = (
            f"{p.in_flight} in flight · {p.waiting} waiting · {p.failed} failed · "
            f"{p.tokens} tokens · {rate:.1f}/s"
            + (f" · {', '.join(sick)}: {', '.join(health[n].status for n in sick)}" if sick else "")
            + (f" · [yellow]paused: {p.paused}" if p.paused else "")
        )
        self.progress.update(
            self.task, total=p.total, completed=p.done + p.failed + p.skipped, state=state
        )


def _summary(s: streamres.BatchSummary, out: Callable[[str], None]) -> None:
    tried = s.answered + s.failed
    rate = f"{s.success_rate:.1%} of those tried" if tried else "none was tried"
    out(
        f"{s.answered} answered, {s.failed} failed, {s.skipped} already done, of {s.total} "
        f"({rate}); {plural(s.attempts, 'attempt')}, "
        f"{s.retries} {'retry' if s.retries == 1 else 'retries'}, "
        f"{plural(s.resumes, 'resume')}, {plural(s.fallbacks, 'fallback')}; "
        f"{s.input_tokens} tokens in, {s.output_tokens} out; {s.wall:.1f} s"
    )
    if s.errors_file:
        out(f"failed requests are in {s.errors_file} (as OpenAI's batch error file)")
    for ident, line, message in s.failures:
        out(f"  line {line}" + (f" ({ident})" if ident else "") + f": {message}")


async def _run(args: argparse.Namespace) -> int:
    err = sys.stderr
    async with _client(args) as (client, aliases, model):
        live: _Live | None = None
        if err.isatty():
            live = _Live(Console(file=err), client)
            report: Callable[[streamres.BatchProgress], None] = live
        else:
            report = _Plain(err)
        with live.progress if live is not None else contextlib.nullcontext():
            summary = await streamres.run_batch(
                client,
                args.requests,
                args.output,
                concurrency=args.concurrency,
                priority=args.priority,
                when=args.when,
                window=args.window,
                models=aliases,
                model=model,
                on_progress=report,
                errors=args.errors,
            )
    _summary(summary, print)
    return 0 if summary.ok else 1


def main(argv: Sequence[str], configure: Callable[[], None] | None = None) -> int:
    p = parser()
    args = p.parse_args(list(argv))
    if configure is not None:
        configure()
    if not args.config:
        refusal = offline_refusal(args)
        if refusal is not None:
            p.error(refusal)
    try:
        return anyio.run(_run, args)
    except KeyboardInterrupt:
        print(
            f"\nstreamres batch: interrupted; the answers so far are in {args.output} — run the "
            "same command again to finish the rest",
            file=sys.stderr,
        )
        return 130
    except streamres.InvalidRequest as exc:
        print(f"streamres batch: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:  # a config or fault plan that does not parse
        print(f"streamres batch: {exc}", file=sys.stderr)
        return 2
