"""The chat session: questions, answers with their recovery, and the /commands."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio

import streamres
from streamres._shell.apps import (
    DEFAULT_MODELS,
    Parser,
    add_target_arguments,
    offline_refusal,
    positive_seconds,
    real_target,
)
from streamres.chat.keys import Prompt, held_keys
from streamres.chat.render import Screen, table
from streamres.chat.words import (
    HELP,
    LANGS,
    default_lang,
    health_reason,
    reason,
    status_line,
    words,
)
from streamres.upstream import PRESETS, FaultPlan, ModelSpec, Upstream, demo_storm

__all__ = ["embedded", "main", "parser", "run"]

LARGE, SMALL = "demo-large", "demo-small"
COMMANDS = ("/models", "/health", "/stats", "/faults", "/retry", "/save", "/help", "/quit")


@dataclass
class AnswerStats:
    """How one answer went (for /stats)."""

    outcome: Literal["ok", "stopped", "failed"]
    attempts: int
    resumes: int
    repeated_tokens: int
    seconds: float
    #: Seconds that produced no answer text: failed attempts, backoff and waits.
    lost: float
    model: str


@dataclass
class Turn:
    """One question and its answer as the transcript keeps them."""

    question: str
    answer: str = ""
    mark: str = ""  # why the answer is partial or missing (for /save)
    #: Requests made so far, as the status events number them (a stopped answer has no done
    #: event to count them from).
    attempts: int = 0
    resumes: int = 0


@dataclass
class Session:
    client: streamres.Client
    screen: Screen
    lang: str
    upstream: Upstream | None
    history: list[dict[str, str]] = field(default_factory=list)
    deadline: float = 120.0
    stall_timeout: float | None = None
    fault_label: str = ""
    #: Seed of the embedded upstream's storm (``/faults storm`` starts it again).
    seed: int = 7
    turns: list[Turn] = field(default_factory=list)
    stats: list[AnswerStats] = field(default_factory=list)
    #: Keys typed during the last answer: the next prompt starts with them.
    typed: str = ""

    def words(self, key: str, **kw: Any) -> str:
        return words(self.lang, key, **kw)

    async def answer(self, question: str) -> bool:
        """Stream one answer into the history; False if it failed or was stopped."""
        self.history.append({"role": "user", "content": question})
        turn = Turn(question)
        self.turns.append(turn)
        started = anyio.current_time()
        done: streamres.DoneEvent | None = None
        error: streamres.StreamError | None = None
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_cancel_on_sigint, scope)
                with held_keys(scope.cancel) as typed:
                    try:
                        done = await self._stream(turn)
                    except streamres.StreamError as exc:
                        error = exc
                    finally:
                        tg.cancel_scope.cancel()
                self.typed = "".join(typed)
        self._record(turn, done, error, scope.cancelled_caught, started)
        if turn.answer:
            self.history.append({"role": "assistant", "content": turn.answer})
        else:
            self.history.pop()
        return done is not None

    async def _stream(self, turn: Turn) -> streamres.DoneEvent | None:
        async with self.client.stream(
            self.history,
            model=self.client.routes[0].key,  # the first model, then its fallbacks
            deadline=self.deadline,
            stall_timeout=self.stall_timeout,
        ) as events:
            turn.attempts = 1
            async for ev in events:
                if ev.type in ("retry", "resume", "fallback"):
                    turn.attempts = max(turn.attempts, ev.attempt)  # the next request's number
                    turn.resumes += ev.type == "resume"
                if ev.type == "text":
                    turn.answer += ev.text
                    self.screen.text(ev.text)
                elif ev.type in ("thinking", "tool_call"):
                    continue  # reasoning streams from some models unasked: not shown
                elif ev.type == "done":
                    return ev
                else:
                    self.screen.status(status_line(ev, self.lang))
        return None

    def _record(
        self,
        turn: Turn,
        done: streamres.DoneEvent | None,
        error: streamres.StreamError | None,
        stopped: bool,
        started: float,
    ) -> None:
        """The end of an answer on screen, in the transcript and in the stats."""
        self.screen.end_answer()
        elapsed = anyio.current_time() - started
        history = done.history if done else error.history if error else ()
        productive = sum(a.seconds for a in history if a.chars)
        if done is not None:
            resumes = done.resumes
        elif error is not None:
            resumes = sum(1 for a in history[1:] if a.chars)
        else:  # stopped: no history came back, only the status events
            resumes = turn.resumes
        stats = AnswerStats(
            outcome="ok" if done else "failed" if error else "stopped",
            attempts=len(history) or turn.attempts,
            resumes=resumes,
            repeated_tokens=done.usage.wasted_tokens if done else 0,
            seconds=elapsed,
            lost=max(0.0, elapsed - productive),
            model=done.model if done else error.model if error and error.model else "",
        )
        self.stats.append(stats)
        if done is not None and done.join == "ended_at_seam":  # (the chat offers no tools)
            self.screen.note(self.words("ended_at_seam"))
            turn.mark = self.words("mark_seam")
        elif done is not None and done.attempts > 1:
            self.screen.note(
                self.words(
                    "summary",
                    seconds=elapsed,
                    attempts=done.attempts,
                    resumes=done.resumes,
                    dedup=done.usage.wasted_tokens,
                    model=done.model,
                )
            )
        elif error is not None:
            shown = str(error) if self.lang == "en" else reason(self.lang, error.reason)
            self.screen.note(self.words("failed", error=shown))
            key = "mark_failed" if turn.answer else "mark_failed_empty"
            turn.mark = self.words(key, error=shown)
        elif stopped:
            self.screen.note(self.words("interrupted" if turn.answer else "interrupted_empty"))
            turn.mark = self.words("mark_interrupted")

    # -- commands --------------------------------------------------------------------------

    def command(self, line: str) -> bool:
        """Run a /command; False to leave."""
        cmd, _, arg = line.partition(" ")
        arg = arg.strip()
        if cmd in ("/quit", "/exit"):
            return False
        handler: dict[str, Callable[[str], None]] = {
            "/help": self._help,
            "/models": self._models,
            "/health": self._health,
            "/stats": self._stats,
            "/faults": self._faults,
            "/save": self._save,
        }
        if cmd in handler:
            handler[cmd](arg)
        else:
            self.screen.note(self.words("unknown", cmd=cmd))
        return True

    def _help(self, arg: str) -> None:
        self.screen.show(table([self.words("h_command"), self.words("h_does")], HELP[self.lang]))

    def _models(self, arg: str) -> None:
        rows = []
        for name, m in self.client.metrics().items():
            route = next(r for r in self.client.routes if r.key == name)
            rows.append(
                (
                    name,
                    route.provider,
                    str(route.base_url),
                    f"{m.weight:.2f}",
                    self.words(m.breaker),
                )
            )
        heads = ("h_model", "h_provider", "h_url", "h_weight", "h_breaker")
        self.screen.show(table([self.words(h) for h in heads], rows))

    def _health(self, arg: str) -> None:
        self.screen.show(health_table(self.client.metrics(), self.lang))

    def _stats(self, arg: str) -> None:
        if not self.stats:
            self.screen.note(self.words("no_stats"))
            return
        rows = [
            (
                str(i),
                self.words("failed_short" if s.outcome == "failed" else s.outcome),
                str(s.attempts),
                str(s.resumes),
                str(s.repeated_tokens),
                f"{s.lost:.1f} s",
                f"{s.seconds:.1f} s",
                s.model,
            )
            for i, s in enumerate(self.stats, 1)
        ]
        heads = (
            "h_answer",
            "h_outcome",
            "h_attempts",
            "h_resumes",
            "h_repeated",
            "h_lost",
            "h_seconds",
            "h_model",
        )
        self.screen.show(table([self.words(h) for h in heads], rows))

    def _faults(self, arg: str) -> None:
        if self.upstream is None:
            self.screen.note(self.words("faults_real"))
            return
        if not arg:
            self.screen.note(self.fault_label)
            return
        try:
            first, second, label = embedded_faults(arg, self.seed, self.lang)
        except ValueError as exc:
            self.screen.note(str(exc))
            return
        # From the next answer on, the models do what the new plan says (and only that: the
        # storm that was running stops).
        names = [r.model for r in self.client.routes]
        for name, plan in zip(names, (first, second), strict=False):
            self.upstream.models.setdefault(name, ModelSpec()).faults = plan
        self.fault_label = label
        self.screen.note(self.words("faults_now", faults=label))

    def _save(self, arg: str) -> None:
        path = arg or "transcript.md"
        with open(path, "w", encoding="utf-8") as f:
            for turn in self.turns:
                f.write(f"**user**\n\n{turn.question}\n\n")
                if turn.answer:
                    f.write(f"**assistant**\n\n{turn.answer}\n\n")
                if turn.mark:
                    f.write(f"*{turn.mark}*\n\n")
        n = sum(1 + bool(t.answer) for t in self.turns)
        self.screen.note(self.words("saved", n=n, path=path))


def health_table(metrics: dict[str, streamres.ModelMetrics], lang: str = "en") -> Any:
    """Per-model health as a table, then why each model is where it is (wrapped lines)."""
    from rich.console import Group
    from rich.text import Text

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:.0%}"

    def secs(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}s"

    heads = (
        "h_model",
        "h_health",
        "h_requests",
        "h_success",
        "h_capacity",
        "h_stalls",
        "h_resumes",
        "h_ttft",
        "h_latency",
        "h_breaker",
    )
    rows = [
        (
            name,
            words(lang, m.health.status),
            str(m.requests),
            pct(m.success_rate),
            str(m.capacity_errors),
            str(m.stalls),
            str(m.resumes),
            secs(m.ttft_p50),
            secs(m.latency_p95),
            words(lang, m.breaker),
        )
        for name, m in metrics.items()
    ]
    why = [
        Text(f"  {name}: " + "; ".join(health_reason(lang, r) for r in m.health.reasons))
        for name, m in metrics.items()
        if m.health.reasons
    ]
    return Group(table([words(lang, h) for h in heads], rows, wrap_last=False), *why)


async def _cancel_on_sigint(scope: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGINT) as signals:
        async for _ in signals:
            scope.cancel()
            return


def embedded_faults(spec: str, seed: int, lang: str = "en") -> tuple[FaultPlan, FaultPlan, str]:
    """Fault plans for the two demo models, and their label; the default storm shows a retry,
    a resume and a fallback in the first answer, then keeps a sustained, lighter storm going."""
    if spec == "storm":
        large, small = demo_storm(seed)
        return large, small, words(lang, "faults_storm")
    plan = PRESETS.get(spec, spec)
    label = words(lang, f"faults_{spec}") if spec in ("none", "light") else spec or "none"
    return FaultPlan(plan), FaultPlan(), label


@contextlib.asynccontextmanager
async def _client(
    args: argparse.Namespace,
) -> AsyncIterator[tuple[streamres.Client, Upstream | None, str]]:
    real = real_target(args)
    provider: Literal["openai", "anthropic"] = real[0] if real else (args.provider or "openai")
    if real:
        default = DEFAULT_MODELS[provider]
        routes = [
            streamres.Route(
                name,
                provider=provider,
                base_url=args.base_url,
                api_key=args.api_key,
                size=-i,
                family="chain",
            )
            for i, name in enumerate(args.model or [default])
        ]
        async with streamres.Client(
            routes, deadline=args.deadline, stall_timeout=args.stall_timeout
        ) as client:
            yield client, None, ", ".join(r.model for r in client.routes)
        return
    async with (
        embedded(args) as (up, routes, label),
        streamres.Client(
            routes,
            deadline=args.deadline,
            stall_timeout=args.stall_timeout,
            backoff=streamres.Backoff(initial=0.5, maximum=5),
        ) as client,
    ):
        yield client, up, label


@contextlib.asynccontextmanager
async def embedded(
    args: argparse.Namespace, *, account: str | None = None
) -> AsyncIterator[tuple[Upstream, list[streamres.Route], str]]:
    """The embedded upstream with the demo's two models and their faults, the routes to them
    (one family: the first asked first, the second its fallback) and the faults' label.
    ``--model`` names the embedded models too (also used by ``streamres batch``)."""
    large, small, label = embedded_faults(args.faults, args.seed, getattr(args, "lang", "en"))
    names = list(dict.fromkeys(args.model or [LARGE, SMALL]))
    if len(names) == 1:
        names.append(SMALL if names[0] != SMALL else LARGE)
    models = {names[0]: ModelSpec(faults=large), names[1]: ModelSpec(faults=small)}
    provider: Literal["openai", "anthropic"] = args.provider or "openai"
    async with Upstream(
        models=models, token_delay=args.token_delay, ping_interval=0.5, words=args.words
    ) as up:
        url = up.openai_url if provider == "openai" else up.anthropic_url
        routes = [
            streamres.Route(
                name,
                provider=provider,
                base_url=url,
                api_key="demo",
                family="demo",
                size=len(names) - i,
                account=account,
            )
            for i, name in enumerate(names)
        ]
        yield up, routes, label


def _screen(args: argparse.Namespace) -> Screen:
    tty = sys.stdout.isatty()
    render = args.render
    markdown = tty and render != "plain" and os.environ.get("TERM", "") != "dumb"
    return Screen(out=sys.stdout, err=sys.stderr, tty=tty and render != "plain", markdown=markdown)


async def run(args: argparse.Namespace) -> int:
    screen = _screen(args)
    async with _client(args) as (client, upstream, label):
        session = Session(
            client,
            screen,
            args.lang,
            upstream,
            deadline=args.deadline,
            stall_timeout=args.stall_timeout,
            seed=args.seed,
            fault_label=label,
        )
        if args.once is not None:
            return 0 if await session.answer(args.once) else 1
        screen.note(session.words("welcome"))
        names = ", ".join(r.model for r in client.routes)
        if upstream is not None:
            screen.note(session.words("target_embedded", models=names, faults=label))
        else:
            screen.note(session.words("target_real", models=names))
        prompt = Prompt(COMMANDS, [r.model for r in client.routes], session.words("ctrl_c_prompt"))
        return await _loop(session, prompt)


async def _loop(session: Session, prompt: Prompt) -> int:
    last_question: str | None = None
    while True:
        line = await prompt.read(session.words("prompt"), default=session.typed)
        session.typed = ""
        if line is None:
            session.screen.note(f"\n{session.words('bye')}")
            return 0
        line = line.strip()
        if not line:
            continue
        if line == "/retry":
            if last_question is None:
                session.screen.note(session.words("nothing"))
                continue
            if session.history and session.history[-1]["role"] == "assistant":
                session.history.pop()
            if session.history and session.history[-1]["role"] == "user":
                session.history.pop()
            await session.answer(last_question)
            continue
        if line.startswith("/"):
            if not session.command(line):
                session.screen.note(session.words("bye"))
                return 0
            continue
        last_question = line
        await session.answer(line)


def parser(prog: str = "streamres chat") -> argparse.ArgumentParser:
    p = Parser(prog=prog, description="a terminal chat whose answers keep streaming")
    add_target_arguments(p, token_delay=0.02)
    p.add_argument(
        "--lang",
        choices=LANGS,
        default=default_lang(),
        help="en or zh (default: from the locale)",
    )
    p.add_argument("--once", metavar="QUESTION", help="answer one question and exit")
    p.add_argument(
        "--render",
        choices=["auto", "plain"],
        default="auto",
        help="auto: Markdown styles and an in-place status line on a terminal",
    )
    p.add_argument("--seed", type=int, default=7, help="embedded fault storm seed")
    p.add_argument(
        "--stall-timeout",
        type=positive_seconds,
        default=None,
        help="fixed seconds without output before resuming (default: adaptive, following the "
        "stream's own pace)",
    )
    return p


def main(argv: list[str] | None = None, *, configure: Callable[[], None] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    refusal = offline_refusal(args)
    if refusal is not None:
        p.error(refusal)
    if configure is not None:
        configure()
    try:
        return anyio.run(run, args)
    except KeyboardInterrupt:
        return 130
    except (ValueError, streamres.StreamError) as exc:
        print(f"streamres chat: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
