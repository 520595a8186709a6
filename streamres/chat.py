"""``streamres chat``: a terminal chat whose answers keep streaming through capacity errors.

Also the example UI integration: it uses only the public API (``streamres`` and
``streamres.upstream``). The pieces a UI needs are all here: text events written as they come,
one neutral status line updated in place and cleared when text flows again, a summary after an
answer that needed recovery, Ctrl-C that stops an answer but keeps what arrived.

With no configuration it talks to the embedded upstream (two models of one family) under a
fault storm, so resume and fallback show up in the first answer.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import unicodedata
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TextIO

import anyio

import streamres
from streamres._apps.cliargs import Parser, positive_int, positive_seconds, seconds_or_zero
from streamres.upstream import PRESETS, FaultPlan, ModelSpec, Upstream

__all__ = ["MarkdownStyler", "main"]

LARGE, SMALL = "demo-large", "demo-small"

# -- words ---------------------------------------------------------------------------------

_REASONS = {
    "en": {
        "capacity": "Model busy (at capacity)",
        "rate_limit": "Rate limited",
        "transient": "Server error",
        "connection": "Connection dropped",
        "stall": "No output for a while",
        "truncated": "The answer was cut short",
        "malformed": "Garbled data from the server",
        "prefill_rejected": "Model refused the partial answer",
        "circuit_open": "All models are busy",
    },
    "zh": {
        "capacity": "模型繁忙（容量已满）",
        "rate_limit": "请求过于频繁",
        "transient": "服务器错误",
        "connection": "连接中断",
        "stall": "长时间没有输出",
        "truncated": "回答被截断",
        "malformed": "服务器返回了无法解析的数据",
        "prefill_rejected": "模型不接受部分回答",
        "circuit_open": "所有模型都很忙",
    },
}
_TEXT = {
    "en": {
        "retry": "{reason} — retrying in {delay:.0f} s (attempt {attempt})",
        "resume": "{reason} after {tokens} tokens — resuming…",
        "fallback": "Many people are using {a} right now — switching you to {b}",
        "interrupted": "[interrupted — the partial answer is kept]",
        "failed": "[failed: {error}]",
        "summary": "↻ recovered in {seconds:.1f} s: {attempts} attempts, resumed {resumes}×, "
        "{dedup} repeated tokens removed, answered by {model}",
        "welcome": "streamres chat — answers keep streaming through capacity errors. "
        "Type /help for commands, Ctrl-D to leave.",
        "target_embedded": "Talking to the embedded upstream ({models}) with faults: {faults}",
        "target_real": "Talking to {models}",
        "ctrl_c_prompt": "(Ctrl-D or /quit to leave)",
        "bye": "bye",
        "help": "/models  the models and their state\n"
        "/health  per-model success rate, capacity errors, latency, breaker\n"
        "/faults [PLAN]  show or queue embedded upstream faults (e.g. reset@40,529)\n"
        "/retry   regenerate the last answer\n"
        "/save FILE  save the transcript as Markdown\n"
        "/quit    leave (or Ctrl-D); Ctrl-C stops an answer and keeps what arrived",
        "saved": "saved {n} messages to {path}",
        "nothing": "nothing to retry yet",
        "unknown": "unknown command {cmd}; /help lists them",
        "faults_now": "faults from the next answer: {faults}",
        "faults_real": "/faults only applies to the embedded upstream",
    },
    "zh": {
        "retry": "{reason} — {delay:.0f} 秒后重试（第 {attempt} 次）",
        "resume": "{reason}（已收到 {tokens} 个 token）— 正在续传…",
        "fallback": "{a} 当前使用人数较多 — 正在为你切换到 {b}",
        "interrupted": "[已中断 — 保留已收到的部分回答]",
        "failed": "[失败：{error}]",
        "summary": "↻ 已恢复，用时 {seconds:.1f} 秒：{attempts} 次请求，{resumes} 次续传，"
        "去除 {dedup} 个重复 token，由 {model} 完成",
        "welcome": "streamres chat — 即使模型满载，回答也不会中断。"
        "输入 /help 查看命令，Ctrl-D 退出。",
        "target_embedded": "正在连接内置上游（{models}），故障计划：{faults}",
        "target_real": "正在连接 {models}",
        "ctrl_c_prompt": "（按 Ctrl-D 或输入 /quit 退出）",
        "bye": "再见",
        "help": "/models  模型及其状态\n"
        "/health  各模型成功率、容量错误、延迟、熔断状态\n"
        "/faults [计划]  查看或追加内置上游故障（如 reset@40,529）\n"
        "/retry   重新生成上一个回答\n"
        "/save 文件  将对话保存为 Markdown\n"
        "/quit    退出（或 Ctrl-D）；Ctrl-C 停止当前回答并保留已收到的内容",
        "saved": "已将 {n} 条消息保存到 {path}",
        "nothing": "还没有可以重试的回答",
        "unknown": "未知命令 {cmd}；/help 列出所有命令",
        "faults_now": "从下一个回答起的故障：{faults}",
        "faults_real": "/faults 只适用于内置上游",
    },
}


def status_line(ev: Any, lang: str) -> str:
    """A status event in the user's language (English is the library's own message)."""
    if lang == "en":
        return str(ev.message)
    words, reasons = _TEXT[lang], _REASONS[lang]
    reason = reasons.get(ev.reason, ev.reason)
    if ev.type == "retry":
        return words["retry"].format(reason=reason, delay=ev.delay, attempt=ev.attempt)
    if ev.type == "resume":
        return words["resume"].format(reason=reason, tokens=ev.tokens_so_far)
    return words["fallback"].format(a=ev.from_model, b=ev.to_model)


# -- rendering -----------------------------------------------------------------------------

BOLD, DIM, ITALIC, RESET = "\x1b[1m", "\x1b[2m", "\x1b[3m", "\x1b[0m"


class MarkdownStyler:
    """Streaming Markdown to ANSI, one piece at a time, holding back at most a few characters.

    Handles what chat answers use most: ``**bold**``, ``*italic*``, ```code```, fenced code
    blocks and ``#`` headings. Markers are replaced by styles; everything else passes as is.
    """

    def __init__(self) -> None:
        self._pending = ""
        self._bold = self._italic = self._code = self._fence = self._heading = False
        self._line_start = True
        self._final = False

    def _style(self) -> str:
        out = RESET
        if self._bold or self._heading:
            out += BOLD
        if self._italic:
            out += ITALIC
        if self._code or self._fence:
            out += DIM
        return out

    def feed(self, text: str) -> str:
        buf = self._pending + text
        self._pending = ""
        out: list[str] = []
        i = 0
        while i < len(buf):
            c = buf[i]
            rest = buf[i:]
            if (
                self._line_start
                and not self._final
                and c in "#`"
                and len(rest) < 4
                and "\n" not in rest
            ):
                self._pending = rest  # could be a heading or a fence: wait for more
                break
            if self._line_start and rest.startswith("```"):
                self._fence = not self._fence
                end = buf.find("\n", i)
                if end < 0 and not self._final:
                    self._pending = rest
                    break
                end = len(buf) - 1 if end < 0 else end
                out.append(self._style())
                i = end + 1
                self._line_start = True
                continue
            if self._line_start and c == "#" and not self._fence:
                j = i
                while j < len(buf) and buf[j] == "#":
                    j += 1
                if j < len(buf) and buf[j] == " ":
                    self._heading = True
                    out.append(self._style())
                    i = j + 1
                    self._line_start = False
                    continue
            self._line_start = False
            if c == "\n":
                if self._heading:
                    self._heading = False
                    out.append(self._style())
                out.append(c)
                self._line_start = True
            elif self._fence:
                out.append(c)
            elif c == "`":
                self._code = not self._code
                out.append(self._style())
            elif c == "*" and not self._code:
                if i + 1 == len(buf) and not self._final:
                    self._pending = c
                    break
                if i + 1 < len(buf) and buf[i + 1] == "*":
                    self._bold = not self._bold
                    i += 1
                else:
                    self._italic = not self._italic
                out.append(self._style())
            else:
                out.append(c)
            i += 1
        return "".join(out)

    def close(self) -> str:
        """End of the answer: what was held back, then plain style."""
        self._final = True
        tail = self.feed("")
        self._final = False
        return tail + RESET


def _width(text: str) -> int:
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


@dataclass
class Screen:
    """Answer text and one status line, on a terminal or on plain streams."""

    out: TextIO
    err: TextIO
    tty: bool
    markdown: bool
    styler: MarkdownStyler = field(default_factory=MarkdownStyler)
    status_shown: bool = False

    def text(self, text: str) -> None:
        self.clear_status()
        self.out.write(self.styler.feed(text) if self.markdown else text)
        self.out.flush()

    def end_answer(self) -> None:
        self.clear_status()
        if self.markdown:
            self.out.write(self.styler.close())
            self.styler = MarkdownStyler()
        self.out.write("\n")
        self.out.flush()

    def status(self, message: str) -> None:
        if not self.tty:
            print(f"  · {message}", file=self.err, flush=True)
            return
        # Below the current line, without moving the text cursor: IND makes room (scrolling if
        # needed, keeping the column), RI comes back, DECSC/DECRC save and restore the cursor.
        room = "" if self.status_shown else "\x1bD\x1bM"
        self.out.write(f"{room}\x1b7\x1bD\r\x1b[2K{DIM}  ⟳ {message}{RESET}\x1b8")
        self.out.flush()
        self.status_shown = True

    def clear_status(self) -> None:
        if self.status_shown:
            self.out.write("\x1b7\x1bD\r\x1b[2K\x1b8")
            self.status_shown = False

    def note(self, message: str) -> None:
        """A line of the app's own (summary, command output)."""
        stream = self.out if self.tty else self.err
        print(f"{DIM}{message}{RESET}" if self.tty else message, file=stream, flush=True)


# -- the app -------------------------------------------------------------------------------


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

    def words(self, key: str, **kw: Any) -> str:
        return _TEXT[self.lang][key].format(**kw)

    async def answer(self, question: str) -> bool:
        """Stream one answer into the history; False if it failed or was interrupted."""
        self.history.append({"role": "user", "content": question})
        got = ""
        ok = False
        started = anyio.current_time()
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_cancel_on_sigint, scope)
                try:
                    async with self.client.stream(
                        self.history,
                        model=self.client.routes[0].key,  # the first model, then its fallbacks
                        deadline=self.deadline,
                        stall_timeout=self.stall_timeout,
                    ) as events:
                        async for ev in events:
                            if ev.type == "text":
                                got += ev.text
                                self.screen.text(ev.text)
                            elif ev.type in ("thinking", "tool_call"):
                                continue  # reasoning streams from some models unasked: not shown
                            elif ev.type == "done":
                                self.screen.end_answer()
                                ok = True
                                if ev.attempts > 1:
                                    self.screen.note(
                                        self.words(
                                            "summary",
                                            seconds=anyio.current_time() - started,
                                            attempts=ev.attempts,
                                            resumes=ev.resumes,
                                            dedup=ev.usage.wasted_tokens,
                                            model=ev.model,
                                        )
                                    )
                            else:
                                self.screen.status(status_line(ev, self.lang))
                except streamres.StreamError as exc:
                    self.screen.end_answer()
                    self.screen.note(self.words("failed", error=exc))
                finally:
                    tg.cancel_scope.cancel()
        interrupted = scope.cancelled_caught
        if interrupted:
            self.screen.end_answer()
            self.screen.note(self.words("interrupted"))
        if got:
            self.history.append({"role": "assistant", "content": got})
        else:
            self.history.pop()
        return ok

    def command(self, line: str) -> bool:
        """Run a /command; False to leave."""
        cmd, _, arg = line.partition(" ")
        arg = arg.strip()
        if cmd in ("/quit", "/exit"):
            return False
        if cmd == "/help":
            self.screen.note(self.words("help"))
        elif cmd == "/models":
            for name, m in self.client.metrics().items():
                route = next(r for r in self.client.routes if r.key == name)
                self.screen.note(
                    f"{name:<22} {route.provider:<9} {route.base_url}  "
                    f"weight {m.weight:.2f}  breaker {m.breaker}"
                )
        elif cmd == "/health":
            self.screen.note(health_table(self.client.metrics()))
        elif cmd == "/faults":
            if self.upstream is None:
                self.screen.note(self.words("faults_real"))
            elif arg:
                try:
                    first, second, label = _embedded_faults(arg, self.seed)
                except ValueError as exc:
                    self.screen.note(str(exc))
                else:
                    # From the next answer on, the models do what the new plan says (and only
                    # that: the storm that was running stops).
                    names = [r.model for r in self.client.routes]
                    for name, plan in zip(names, (first, second), strict=False):
                        self.upstream.models.setdefault(name, ModelSpec()).faults = plan
                    self.fault_label = label
                    self.screen.note(self.words("faults_now", faults=label))
            else:
                self.screen.note(self.fault_label)
        elif cmd == "/save":
            path = arg or "transcript.md"
            with open(path, "w", encoding="utf-8") as f:
                for msg in self.history:
                    f.write(f"**{msg['role']}**\n\n{msg['content']}\n\n")
            self.screen.note(self.words("saved", n=len(self.history), path=path))
        else:
            self.screen.note(self.words("unknown", cmd=cmd))
        return True


def health_table(metrics: dict[str, streamres.ModelMetrics]) -> str:
    """Per-model health as a small text table."""

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:.0%}"

    def secs(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}s"

    rows = [
        (
            "model",
            "health",
            "requests",
            "success",
            "capacity",
            "stalls",
            "resumes",
            "ttft p50",
            "latency p95",
            "breaker",
        ),
    ]
    for name, m in metrics.items():
        rows.append(
            (
                name,
                m.health.status,
                str(m.requests),
                pct(m.success_rate),
                str(m.capacity_errors),
                str(m.stalls),
                str(m.resumes),
                secs(m.ttft_p50),
                secs(m.latency_p95),
                m.breaker,
            )
        )
    widths = [max(_width(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(c + " " * (w - _width(c)) for c, w in zip(r, widths, strict=True)) for r in rows
    ]
    for name, m in metrics.items():
        if m.health.reasons:
            lines.append(f"  {name}: {'; '.join(m.health.reasons)}")
    return "\n".join(lines)


async def _cancel_on_sigint(scope: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGINT) as signals:
        async for _ in signals:
            scope.cancel()
            return


async def _read_line(prompt: str, screen: Screen, hint_text: str) -> str | None:
    """The next input line (None at end of input). Ctrl-C at the prompt only shows a hint."""
    screen.out.write(prompt)
    screen.out.flush()
    async with anyio.create_task_group() as tg:
        result: list[str] = []

        async def read() -> None:
            result.append(
                await anyio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
            )
            tg.cancel_scope.cancel()

        async def hint() -> None:
            with anyio.open_signal_receiver(signal.SIGINT) as signals:
                async for _ in signals:
                    screen.out.write(f"\n{hint_text}\n{prompt}")
                    screen.out.flush()

        tg.start_soon(read)
        tg.start_soon(hint)
    line = result[0] if result else ""
    return None if line == "" else line.rstrip("\n")


DEFAULT_MODELS = {"openai": "gpt-4o-mini", "anthropic": "claude-sonnet-4-5"}


def real_target(
    args: argparse.Namespace,
) -> tuple[Literal["openai", "anthropic"], str | None, str | None] | None:
    """``(provider, base_url, api_key)`` of the real service the flags or the environment
    point at, or ``None`` for the embedded upstream (also used by ``streamres ask``)."""
    if args.embedded:
        return None
    if args.base_url or args.api_key:
        return (args.provider or "openai", args.base_url, args.api_key)
    if args.provider in (None, "openai") and (
        os.environ.get("OPENAI_API_KEY") or os.environ.get("OPENAI_BASE_URL")
    ):
        return ("openai", None, None)
    if args.provider in (None, "anthropic") and os.environ.get("ANTHROPIC_API_KEY"):
        return ("anthropic", None, None)
    return None


def _embedded_faults(spec: str, seed: int) -> tuple[FaultPlan, FaultPlan, str]:
    """Fault plans for the two demo models; the default storm shows a retry, a resume and a
    fallback in the first answer, then keeps a sustained, lighter storm going."""
    if spec == "storm":
        large = FaultPlan(
            "529:retry-after=1,error@40,at-capacity*3",
            connect_rate=0.1,
            midstream_rate=0.25,
            stall_rate=0.03,
            max_after=80,
            seed=seed,
        )
        small = FaultPlan(
            "reset@50",
            connect_rate=0.1,
            midstream_rate=0.2,
            stall_rate=0.02,
            max_after=80,
            seed=seed + 1,
        )
        return large, small, "storm (529 → error@40 → at capacity → fallback, then random faults)"
    plan = PRESETS.get(spec, spec)
    return FaultPlan(plan), FaultPlan(), spec or "none"


@contextlib.asynccontextmanager
async def _client(
    args: argparse.Namespace,
) -> AsyncIterator[tuple[streamres.Client, Upstream | None, str]]:
    routes: list[streamres.Route] = []
    real = real_target(args)
    provider: Literal["openai", "anthropic"] = real[0] if real else (args.provider or "openai")
    if real:
        default = DEFAULT_MODELS[provider]
        for i, name in enumerate(args.model or [default]):
            routes.append(
                streamres.Route(
                    name,
                    provider=provider,
                    base_url=args.base_url,
                    api_key=args.api_key,
                    size=-i,
                    family="chain",
                )
            )
        async with streamres.Client(
            routes, deadline=args.deadline, stall_timeout=args.stall_timeout
        ) as client:
            yield client, None, ", ".join(r.model for r in client.routes)
        return
    large, small, label = _embedded_faults(args.faults, args.seed)
    # --model names the embedded models too: the first is asked first, the next its fallback.
    names = list(dict.fromkeys(args.model or [LARGE, SMALL]))
    if len(names) == 1:
        names.append(SMALL if names[0] != SMALL else LARGE)
    models = {names[0]: ModelSpec(faults=large), names[1]: ModelSpec(faults=small)}
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
            )
            for i, name in enumerate(names)
        ]
        async with streamres.Client(
            routes,
            deadline=args.deadline,
            stall_timeout=args.stall_timeout,
            backoff=streamres.Backoff(initial=0.5, maximum=5),
        ) as client:
            yield client, up, label


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
        )
        session.fault_label = label
        if args.once is not None:
            return 0 if await session.answer(args.once) else 1
        screen.note(session.words("welcome"))
        names = ", ".join(r.model for r in client.routes)
        if upstream is not None:
            screen.note(session.words("target_embedded", models=names, faults=label))
        else:
            screen.note(session.words("target_real", models=names))
        last_question: str | None = None
        while True:
            line = await _read_line("you> ", screen, session.words("ctrl_c_prompt"))
            if line is None:
                screen.note(f"\n{session.words('bye')}")
                return 0
            line = line.strip()
            if not line:
                continue
            if line == "/retry":
                if last_question is None:
                    screen.note(session.words("nothing"))
                    continue
                if session.history and session.history[-1]["role"] == "assistant":
                    session.history.pop()
                if session.history and session.history[-1]["role"] == "user":
                    session.history.pop()
                await session.answer(last_question)
                continue
            if line.startswith("/"):
                if not session.command(line):
                    screen.note(session.words("bye"))
                    return 0
                continue
            last_question = line
            await session.answer(line)


def add_target_arguments(p: argparse.ArgumentParser, *, token_delay: float) -> None:
    """Where answers come from: a real service, or the embedded upstream and its faults."""
    p.add_argument(
        "--provider",
        choices=["openai", "anthropic"],
        help="API of the real service (default: openai, or anthropic with only ANTHROPIC_API_KEY)",
    )
    p.add_argument("--base-url", help="a real server's URL (default: $OPENAI_BASE_URL)")
    p.add_argument("--api-key", help="its key (default: $OPENAI_API_KEY / $ANTHROPIC_API_KEY)")
    p.add_argument(
        "--model",
        action="append",
        help="model name; repeat for a fallback chain (embedded default: demo-large)",
    )
    p.add_argument(
        "--embedded", action="store_true", help="the embedded upstream even if keys are set"
    )
    p.add_argument(
        "--faults",
        default="storm",
        help="embedded upstream faults: none, light, storm, or a plan such as 529,reset@40",
    )
    p.add_argument(
        "--token-delay",
        type=seconds_or_zero,
        default=token_delay,
        help="embedded upstream seconds per token",
    )
    p.add_argument(
        "--words", type=positive_int, default=120, help="embedded upstream answer length"
    )
    p.add_argument(
        "--deadline",
        type=positive_seconds,
        default=120.0,
        help="seconds for the whole answer, retries and resumes included",
    )


def parser(prog: str = "streamres chat") -> argparse.ArgumentParser:
    p = Parser(prog=prog, description=__doc__.split("\n")[0] if __doc__ else "")
    add_target_arguments(p, token_delay=0.02)
    p.add_argument("--lang", choices=["en", "zh"], default="en")
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
    args = parser().parse_args(argv)
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
