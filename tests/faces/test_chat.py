"""The terminal chat, end to end in a pseudo-terminal, against the embedded upstream."""

from __future__ import annotations

import io
import itertools
import os
import re
import subprocess
import sys
import tempfile

import pexpect
import pyte
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamres.chat import MarkdownStyler
from streamres.upstream import answer_for

ENV = {k: v for k, v in os.environ.items() if not k.endswith(("_API_KEY", "_BASE_URL"))}
ENV["TERM"] = "xterm-256color"
ENV["PROMPT_TOOLKIT_NO_CPR"] = "1"  # pexpect is not a terminal: nothing answers its queries
ENV["LANG"] = "C.UTF-8"
ENV["STREAMRES_HISTORY"] = os.path.join(tempfile.mkdtemp(prefix="streamres-chat-"), "history")
COLS, ROWS = 1000, 80
Q = "Explain TCP slow start."


def answer(q: str = Q) -> str:
    return answer_for([{"role": "user", "content": q}], words=120)


class Chat:
    def __init__(self, *args: str) -> None:
        self.raw = io.StringIO()
        self.child = pexpect.spawn(
            sys.executable,
            ["-m", "streamres", "chat", "--stall-timeout", "0.5", *args],
            env=ENV,
            encoding="utf-8",
            dimensions=(ROWS, COLS),
            timeout=30,
        )
        self.child.logfile_read = self.raw
        self.prompt()

    def prompt(self, word: str = "you>") -> None:
        """Wait for a new prompt (prompt_toolkit turns bracketed paste on as each one starts,
        and redraws the old prompt line when a question is sent)."""
        self.child.expect("\x1b\\[\\?2004h[^\n]*" + re.escape(word))

    def screen(self) -> list[str]:
        screen = pyte.Screen(COLS, ROWS)
        pyte.Stream(screen).feed(self.raw.getvalue().replace("\n", "\r\n"))
        return [line.rstrip() for line in screen.display]

    def close(self) -> None:
        self.child.sendline("/quit")
        self.child.expect(pexpect.EOF)


def shown(lines: list[str], text: str) -> bool:
    """Is ``text`` on screen, paragraph by paragraph (one line each on a wide terminal)?"""
    paragraphs = [p for p in text.split("\n") if p]
    joined = "\n".join(line for line in lines if line)
    return all(p in joined.split("\n") for p in paragraphs)


def test_mid_stream_fault_gives_the_exact_answer_and_a_passing_status_line() -> None:
    """The answer on screen is exact; the status line appeared, then went away."""
    chat = Chat("--faults", "error@20", "--token-delay", "0.002")
    chat.child.sendline(Q)
    chat.child.expect_exact("recovered")
    chat.prompt()
    assert "resuming" in chat.raw.getvalue()
    lines = chat.screen()
    assert shown(lines, answer())
    assert not any("resuming" in line for line in lines)
    chat.close()


def test_ctrl_c_keeps_the_partial_and_returns_to_the_prompt() -> None:
    """Ctrl-C mid-answer stops it, keeps what arrived, and the chat goes on."""
    chat = Chat("--faults", "none", "--token-delay", "0.05")
    chat.child.sendline(Q)
    first_words = answer().split(" ")[:3]
    chat.child.expect_exact(" ".join(first_words))
    chat.child.sendintr()
    chat.child.expect_exact("[stopped")
    chat.prompt()
    screen = "\n".join(chat.screen())
    partial = screen.split(Q, 1)[1].split("[stopped", 1)[0].replace("^C", "").strip()
    assert partial and answer().startswith(partial)
    assert len(partial) < len(answer())
    chat.child.sendline("/help")
    chat.child.expect_exact("/retry")
    chat.close()


def test_health_shows_what_happened() -> None:
    """/health lists the failures the answer went through, per model."""
    chat = Chat("--faults", "503,reset@20", "--token-delay", "0")
    chat.child.sendline(Q)
    chat.child.expect_exact("recovered")
    chat.child.sendline("/health")
    chat.child.expect_exact("breaker")
    chat.prompt()
    table = [line for line in chat.screen() if line.startswith("demo-large")]
    assert table, chat.screen()
    cells = table[-1].split()
    # model, health, requests, success, capacity, stalls, resumes …
    assert cells[2] == "3" and cells[4] == "1" and cells[6] == "1"
    chat.close()


def test_retry_regenerates_the_last_answer() -> None:
    """/retry asks the last question again, with the same history."""
    chat = Chat("--faults", "none", "--token-delay", "0")
    chat.child.sendline(Q)
    chat.prompt()
    chat.child.sendline("/retry")
    chat.prompt()
    joined = "\n".join(chat.screen())
    assert joined.count(answer().split("\n")[0]) == 2
    chat.close()


def run_once(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamres", "chat", "--stall-timeout", "0.5", *args],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=60,
        check=False,
    )


def test_once_prints_the_answer_and_exits() -> None:
    """--once answers and exits 0; status lines go to stderr when output is not a terminal."""
    got = run_once("--once", Q, "--token-delay", "0")
    assert got.returncode == 0, got.stderr
    assert got.stdout == answer() + "\n"
    assert "switching you to demo-small" in got.stderr


def test_once_failure_exits_non_zero_with_the_partial() -> None:
    """A failed answer exits 1 with the partial answer still printed."""
    got = run_once("--once", Q, "--faults", "reset@10,401", "--token-delay", "0")
    assert got.returncode == 1
    assert got.stdout.strip() and answer().startswith(got.stdout.strip())
    assert "[failed:" in got.stderr


def test_a_chinese_answer_resumed_through_the_storm_shows_no_repeats() -> None:
    """`chat --lang zh` asked in Chinese: a Chinese answer, resumed through the fault storm
    (instruct continuations backing up at varied seams), printed exactly once."""
    q = "解释蜜蜂的舞蹈和TCP慢启动。"
    got = run_once("--once", q, "--lang", "zh", "--token-delay", "0")
    assert got.returncode == 0, got.stderr
    assert "。" in answer(q) and got.stdout == answer(q) + "\n"
    assert "续传" in got.stderr  # it was resumed


def test_chinese_status_lines() -> None:
    """--lang zh speaks to the seed's readers in their language."""
    got = run_once("--once", Q, "--faults", "529,reset@20", "--lang", "zh", "--token-delay", "0")
    assert got.returncode == 0
    assert "模型繁忙" in got.stderr and "续传" in got.stderr


def test_a_chinese_fallback_line_says_why_in_chinese() -> None:
    """A fallback for a reason other than load is not worded as "many people are using": a
    context limit says the conversation is too long, in Chinese."""
    from streamres import FallbackEvent
    from streamres.chat.words import status_line

    ev = FallbackEvent(
        message="This conversation is too long for big — switching you to small",
        attempt=2,
        from_model="big",
        to_model="small",
        reason="context_length",
    )
    line = status_line(ev, "zh")
    assert "上下文长度" in line and "使用人数较多" not in line and "small" in line
    busy = FallbackEvent(
        message="", attempt=2, from_model="big", to_model="small", reason="capacity"
    )
    assert "使用人数较多" in status_line(busy, "zh")
    # A hedge switches nothing yet: the first model is still asked, the other as well.
    hedge = FallbackEvent(message="", attempt=1, from_model="big", to_model="small", reason="hedge")
    line = status_line(hedge, "zh")
    assert "同时询问 small" in line and "切换" not in line


@pytest.mark.parametrize(
    ("md", "ansi"),
    [
        ("a **b** c", "a \x1b[0m\x1b[1mb\x1b[0m c"),
        ("x *y*", "x \x1b[0m\x1b[3my\x1b[0m"),
        ("use `f()`", "use \x1b[0m\x1b[2mf()\x1b[0m"),
        ("# Title\nbody", "\x1b[0m\x1b[1mTitle\x1b[0m\nbody"),
        ("```\ncode\n```\nafter", "\x1b[0m\x1b[2mcode\n\x1b[0mafter"),
    ],
)
def test_markdown_styles(md: str, ansi: str) -> None:
    """Markdown markers become terminal styles."""
    styler = MarkdownStyler()
    assert styler.feed(md) + styler.close() == ansi + "\x1b[0m"


def test_fenced_code_with_a_language_is_highlighted_line_by_line() -> None:
    """```python: each line comes out highlighted by Pygments once it is whole."""
    from pygments import highlight
    from pygments.formatters import TerminalFormatter
    from pygments.lexers import get_lexer_by_name

    styler = MarkdownStyler()
    first = styler.feed("```python\ndef f(x):\n    return 'a'")
    lexer = get_lexer_by_name("python", ensurenl=False, stripnl=False)
    assert first.endswith(highlight("def f(x):\n", lexer, TerminalFormatter()))
    assert "return" not in first  # the second line is not whole yet
    rest = styler.feed("\n```\nafter") + styler.close()
    assert highlight("    return 'a'\n", lexer, TerminalFormatter()) in rest
    assert "\x1b[" in first and rest.endswith("after\x1b[0m")


@given(st.lists(st.integers(min_value=0, max_value=60)))
def test_markdown_styler_ignores_chunking(cuts: list[int]) -> None:
    """However the answer is split into pieces, the styled output is the same."""
    text = (
        "# Head\nsome **bold** and *it* and `code`\n```\nfenced *raw*\n```\n"
        "```python\nx = 1  # *no*\nprint(x)\n```\nend 数据"
    )
    whole = MarkdownStyler()
    expected = whole.feed(text) + whole.close()
    bounds = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    styler = MarkdownStyler()
    got = "".join(styler.feed(text[a:b]) for a, b in itertools.pairwise(bounds))
    assert got + styler.close() == expected


def test_faults_none_gives_a_clean_answer_from_the_next_one() -> None:
    """/faults none during the default storm: the next answer comes with no recovery at all."""
    chat = Chat("--token-delay", "0")
    chat.child.sendline("/faults none")
    chat.child.expect_exact("faults from the next answer: none")
    chat.prompt()
    before = len(chat.raw.getvalue())
    chat.child.sendline(Q)
    chat.prompt()
    after = chat.raw.getvalue()[before:]
    assert "⟳" not in after and "recovered" not in after
    assert shown(chat.screen(), answer())
    chat.close()


def test_model_names_the_embedded_model_asked_first() -> None:
    """--model with the embedded upstream: that model answers (no faults on it here)."""
    got = run_once("--once", Q, "--model", "demo-small", "--faults", "none", "--token-delay", "0")
    assert got.returncode == 0, got.stderr
    models = run_once(
        "--once", Q, "--embedded", "--model", "my-model", "--faults", "529", "--token-delay", "0"
    )
    assert models.returncode == 0 and "my-model" in models.stderr
