"""The ``streamres`` command: ``ask`` one question, ``serve`` the embedded upstream, and the
door to ``chat``, ``proxy``, ``batch`` and ``bench``.

Uses the public API, like any application would, and what the apps share beyond it
(``_shell/apps``: the command line's parser and where answers come from).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio
import structlog

import streamres
from streamres._shell.apps import (
    DEFAULT_MODELS,
    Parser,
    add_target_arguments,
    offline_refusal,
    plural,
    port,
    positive_int,
    positive_seconds,
    real_target,
    seconds_or_zero,
)
from streamres.upstream import PRESETS, FaultPlan, Upstream

__all__ = ["main"]

_DEMO_MODEL = "demo-large"


def _configure_logs(verbose: bool) -> None:
    """Where the library's structlog events go in this app: nowhere by default (the commands
    say what happened themselves, once), everything on stderr with --verbose."""
    level = logging.DEBUG if verbose else logging.CRITICAL
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )


def _faults(spec: str) -> FaultPlan:
    return FaultPlan(PRESETS.get(spec, spec))


@contextlib.asynccontextmanager
async def _target(
    args: argparse.Namespace,
) -> AsyncIterator[tuple[dict[str, Any], Upstream | None]]:
    real = real_target(args)
    if real is not None:
        provider, base_url, api_key = real
        model = args.model or [DEFAULT_MODELS[provider]]
        yield {"provider": provider, "base_url": base_url, "api_key": api_key, "model": model}, None
        return
    provider = args.provider or "openai"
    async with Upstream(
        faults=_faults(args.faults),
        token_delay=args.token_delay,
        ping_interval=0.5,
        words=args.words,
    ) as up:
        url = up.openai_url if provider == "openai" else up.anthropic_url
        yield (
            {
                "provider": provider,
                "base_url": url,
                "api_key": "demo",
                "model": args.model or [_DEMO_MODEL],
            },
            up,
        )


def _question(args: argparse.Namespace) -> str:
    """The question: the argument, ``-`` for standard input, or ``--file``."""
    if args.file is not None:
        with open(args.file, encoding="utf-8") as f:
            return f.read()
    if args.question == "-":
        return sys.stdin.read()
    return str(args.question)


async def _ask(args: argparse.Namespace, question: str) -> int:
    messages = [{"role": "user", "content": question}]
    err = sys.stderr
    async with _target(args) as (target, upstream):
        models = target.pop("model")
        partial = ""
        try:
            async with streamres.stream_resilient(
                messages,
                model=models if len(models) > 1 else models[0],
                deadline=args.deadline,
                stall_timeout=args.stall_timeout,
                first_token_timeout=args.first_token_timeout,
                max_tokens=args.max_tokens,
                **target,
            ) as events:
                async for ev in events:
                    if ev.type == "text":
                        partial += ev.text
                        sys.stdout.write(ev.text)
                        sys.stdout.flush()
                    elif ev.type == "done":
                        sys.stdout.write("\n")
                        print(
                            f"\n[done: {ev.finish_reason}, model {ev.model}, "
                            f"{plural(ev.attempts, 'attempt')}, {plural(ev.resumes, 'resume')}, "
                            f"{plural(ev.deduplicated_chars, 'repeated character')} removed, "
                            f"{plural(ev.usage.delivered_tokens, 'token')}, {ev.elapsed:.1f} s]",
                            file=err,
                        )
                        if upstream is not None:
                            exact = ev.text == upstream.answer(messages)
                            print(
                                f"[embedded upstream: {len(upstream.requests)} requests; "
                                "answer identical to the upstream's text: "
                                f"{'yes' if exact else 'NO'}]",
                                file=err,
                            )
                            return 0 if exact else 1
                    elif ev.type in ("retry", "resume", "fallback"):
                        print(f"\n  ⟳ {ev.message}", file=err, flush=True)
        except streamres.InvalidRequest as exc:  # nothing was sent: a usage error
            print(f"streamres ask: {exc}", file=err)
            return 2
        except streamres.StreamError as exc:
            if exc.partial_text and not partial.endswith("\n"):
                sys.stdout.write("\n")
            print(f"\n[failed: {exc}]", file=err)
            return 1
    return 0


async def _serve(args: argparse.Namespace) -> None:
    faults = _faults(args.faults)
    if args.chaos:
        connect, midstream, stall = (float(x) for x in args.chaos.split(","))
        faults = FaultPlan.storm(seed=args.seed, connect=connect, midstream=midstream, stall=stall)
    up = Upstream(
        port=args.port,
        faults=faults,
        ping_interval=args.ping_interval,
        token_delay=args.token_delay,
        words=args.words,
        prefill=args.prefill,
        instruct=args.instruct,
        max_in_flight=args.max_in_flight,
        framing=args.framing,
        stamp=args.stamp,
    )
    async with up:
        print(
            f"embedded upstream on {up.url}  "
            f"(openai: {up.openai_url}, anthropic: {up.anthropic_url})",
            flush=True,
        )
        await anyio.sleep_forever()


def _parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="streamres",
        description="LLM answers that keep streaming when a model is at capacity.",
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="the library's logs on stderr")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    sub.add_parser("chat", help="terminal chat (see `streamres chat --help`)", add_help=False)
    sub.add_parser("bench", help="benchmarks and a chaos soak (`streamres bench --help`)")
    sub.add_parser(
        "proxy", help="an OpenAI/Anthropic-compatible resilient endpoint", add_help=False
    )
    sub.add_parser(
        "batch",
        help="answer a JSON Lines file of requests, at low priority, resumable "
        "(`streamres batch --help`)",
        add_help=False,
    )

    ask = sub.add_parser(
        "ask",
        help="stream one answer (offline against the embedded upstream by default)",
        description="Stream one answer to QUESTION and print it. Without a real service "
        "configured (OPENAI_API_KEY, ANTHROPIC_API_KEY, --base-url), the embedded upstream "
        "answers through a fault storm, and the command says whether the answer came out "
        "identical to the upstream's own text. Exit code 0 on success, 1 on failure (the "
        "partial answer is still printed), 2 for a usage error.",
    )
    ask.add_argument("question", nargs="?", help="the question; - reads it from standard input")
    ask.add_argument("--file", "-f", help="read the question from this file")
    add_target_arguments(ask, token_delay=0.015)
    ask.add_argument(
        "--stall-timeout",
        type=positive_seconds,
        help="fixed seconds without output before resuming (default: adaptive, following the "
        "stream's own pace)",
    )
    ask.add_argument(
        "--first-token-timeout",
        type=positive_seconds,
        default=60.0,
        help="seconds to wait for an attempt's first output (reasoning models think first)",
    )
    ask.add_argument(
        "--max-tokens", type=positive_int, help="budget for the whole answer, across resumes"
    )

    serve = sub.add_parser(
        "serve",
        help="run the embedded upstream on 127.0.0.1",
        description="Run the embedded upstream (a deterministic fake LLM server speaking the "
        "OpenAI and Anthropic streaming APIs) on 127.0.0.1, with the faults asked for.",
    )
    serve.add_argument("--port", type=port, default=8765, help="port on 127.0.0.1 (0: any free)")
    serve.add_argument(
        "--faults", default="none", help="none, light, storm, or a plan such as 529,reset@40"
    )
    serve.add_argument(
        "--token-delay", type=seconds_or_zero, default=0.0, help="seconds between tokens"
    )
    serve.add_argument("--words", type=positive_int, default=90, help="answer length in words")
    serve.add_argument(
        "--prefill",
        choices=["continue", "restart", "reject"],
        default="continue",
        help="how a prefill continuation is answered",
    )
    serve.add_argument(
        "--instruct",
        choices=["overlap", "exact", "restart", "preamble", "shorter", "quoted", "stutter"],
        default="overlap",
        help="how an instruct continuation is answered",
    )
    serve.add_argument(
        "--max-in-flight", type=positive_int, help="streams per model at once; more get 429"
    )
    serve.add_argument(
        "--ping-interval",
        type=positive_seconds,
        default=0.5,
        help="seconds between keep-alives while stalled",
    )
    serve.add_argument(
        "--chaos",
        metavar="CONNECT,MIDSTREAM,STALL",
        help="a sustained random storm: shares of refused connects, broken and stalled streams",
    )
    serve.add_argument("--seed", type=int, default=0, help="seed of the --chaos storm")
    serve.add_argument(
        "--framing",
        choices=["batched", "event"],
        default="batched",
        help="batched: 32 KiB writes when not paced; event: each token its own write",
    )
    serve.add_argument("--stamp", action="store_true", help=argparse.SUPPRESS)  # benchmarks
    return parser


def _proxy_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="streamres proxy",
        description="Serve OpenAI- and Anthropic-compatible endpoints whose streams survive "
        "capacity errors: point any client's base URL here. Without --config, it fronts the "
        "embedded upstream and its fault storm (offline).",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=port, default=8787, help="port (0: any free)")
    p.add_argument("--config", help="routes.toml: routes, model aliases, client keys, policy")
    p.add_argument(
        "--faults",
        default="storm",
        help="embedded upstream only: none, light, storm, or a plan such as 529,reset@40",
    )
    p.add_argument(
        "--server",
        choices=["uvicorn", "hypercorn"],
        default="uvicorn",
        help="the ASGI server (uvicorn comes with streamres[proxy], hypercorn with "
        "streamres[hypercorn])",
    )
    p.add_argument(
        "--loop",
        choices=["auto", "asyncio", "uvloop"],
        default="auto",
        help="the event loop: uvloop when installed (auto; streamres[proxy] brings it, but on "
        "Windows), or asyncio's own",
    )
    p.add_argument(
        "--redis",
        help="share limits, breakers and cool-downs with other workers and proxies "
        "(redis://host:6379/0, redis+cluster://host:port,…, redis+sentinel://host:port/service)",
    )
    p.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        help="processes serving the port (needs --config)",
    )
    return p


def _proxy(argv: list[str], verbose: bool = False) -> int:
    args = _proxy_parser().parse_args(argv)
    _configure_logs(verbose)
    from streamres import InvalidRequest, proxy

    try:
        proxy.require_server(args.server)  # before anything starts: one line if not installed
        config = proxy.load(args.config) if args.config else None
        if config is None:
            proxy.embedded_models(args.faults)  # a plan that does not parse: one line, exit 2
        if args.workers > 1:
            if config is None:
                print(
                    "streamres proxy: --workers needs --config (each worker loads it); the "
                    "embedded demo upstream runs with one process",
                    file=sys.stderr,
                )
                return 2
            proxy.serve_workers(
                args.config, args.redis, args.host, args.port, args.workers, args.loop
            )
            return 0
        anyio.run(
            proxy.serve,
            config,
            args.host,
            args.port,
            args.faults,
            args.server,
            args.redis,
            backend_options=proxy.event_loop(args.loop),
        )
    except (proxy.ConfigError, InvalidRequest, ValueError) as exc:
        print(f"streamres proxy: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except OSError as exc:
        print(
            f"streamres proxy: cannot listen on {args.host}:{args.port} — {exc.strerror or exc}"
            " (is another server running there? pick another --port)",
            file=sys.stderr,
        )
        return 2
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = False
    while argv[:1] and argv[0] in ("-v", "--verbose"):  # before a command: for every command
        verbose, argv = True, argv[1:]
    if argv[:1] == ["bench"]:
        from streamres import benchmarks as _bench

        return _bench.main(argv[1:])
    if argv[:1] == ["chat"]:
        from streamres import chat

        return chat.main(argv[1:], configure=lambda: _configure_logs(verbose))
    if argv[:1] == ["proxy"]:
        return _proxy(argv[1:], verbose)
    if argv[:1] == ["batch"]:
        from streamres._apps import batch_cli

        return batch_cli.main(argv[1:], configure=lambda: _configure_logs(verbose))
    parser = _parser()
    args = parser.parse_args(argv)
    _configure_logs(args.verbose or verbose)
    try:
        if args.command == "ask":
            if (args.question is None) == (args.file is None):
                parser.error("ask needs a QUESTION (or -) or --file, not both")
            try:
                question = _question(args)
            except OSError as exc:
                parser.error(f"cannot read the question: {exc.strerror}: {exc.filename}")
            if not question.strip():
                parser.error("the question is empty")
            refusal = offline_refusal(args)
            if refusal is not None:
                parser.error(refusal)
            return anyio.run(_ask, args, question)
        anyio.run(_serve, args)
    except KeyboardInterrupt:
        return 130
    except OSError as exc:  # serve: the port is taken, or not ours to take
        print(
            f"streamres serve: cannot listen on 127.0.0.1:{args.port} — {exc.strerror or exc}"
            " (is another server running there? pick another --port)",
            file=sys.stderr,
        )
        return 2
    except ValueError as exc:  # bad fault plan and the like
        print(f"streamres: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
