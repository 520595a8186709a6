"""The chat as a person uses it, in pseudo-terminals of 80×24 and 40×20: line editing and
history, keys typed during an answer, the status line on a narrow screen, Chinese tables."""

from __future__ import annotations

import io
import os
import re
import sys
from pathlib import Path

import pexpect
import pyte
import pytest

from streamres.upstream import answer_for

Q = "Explain TCP slow start."
LEFT, UP = "\x1b[D", "\x1b[A"


def answer(q: str = Q, words: int = 40) -> str:
    return answer_for([{"role": "user", "content": q}], words=words)


class Term:
    """``streamres chat`` in a pseudo-terminal of ``cols``×``rows``, its screen emulated."""

    def __init__(self, tmp: Path, cols: int, rows: int, *args: str, prompt: str = "you>") -> None:
        env = {k: v for k, v in os.environ.items() if not k.endswith(("_API_KEY", "_BASE_URL"))}
        env.update(
            TERM="xterm-256color",
            PROMPT_TOOLKIT_NO_CPR="1",
            LANG="C.UTF-8",
            STREAMRES_HISTORY=str(tmp / "history"),
        )
        self.cols, self.rows, self.word = cols, rows, prompt
        self.raw = io.StringIO()
        self.child = pexpect.spawn(
            sys.executable,
            ["-m", "streamres", "chat", "--words", "40", *args],
            env=env,
            cwd=str(tmp),
            encoding="utf-8",
            dimensions=(rows, cols),
            timeout=30,
        )
        self.child.logfile_read = self.raw
        self.prompt()

    def prompt(self) -> None:
        """Wait for a new prompt (bracketed paste is turned on as each one starts)."""
        self.child.expect("\x1b\\[\\?2004h[^\n]*" + re.escape(self.word))

    def screen(self) -> list[str]:
        screen = pyte.Screen(self.cols, self.rows)
        pyte.Stream(screen).feed(self.raw.getvalue())
        return [line.rstrip() for line in screen.display]

    def save(self, tmp: Path) -> str:
        self.child.sendline("/save t.md")
        self.prompt()
        return (tmp / "t.md").read_text(encoding="utf-8")

    def close(self) -> None:
        self.child.sendline("/quit")
        self.child.expect(pexpect.EOF)


@pytest.mark.parametrize(("cols", "rows"), [(80, 24), (40, 20)])
def test_arrow_keys_edit_the_line_and_history_recalls_it(
    tmp_path: Path, cols: int, rows: int
) -> None:
    """A typo fixed with ← and typing; the question then recalled with ↑ and asked again."""
    term = Term(tmp_path, cols, rows, "--faults", "none", "--token-delay", "0")
    term.child.send("Explain TCP slowstart.")
    term.child.send(LEFT * len("start."))
    term.child.send(" \r")
    term.prompt()
    term.child.send(UP)
    term.child.send("\r")
    term.prompt()
    saved = term.save(tmp_path)
    first = answer()
    asked_again = [
        {"role": "user", "content": Q},
        {"role": "assistant", "content": first},
        {"role": "user", "content": Q},
    ]
    second = answer_for(asked_again, words=40)
    assert saved == (
        f"**user**\n\n{Q}\n\n**assistant**\n\n{first}\n\n"
        f"**user**\n\n{Q}\n\n**assistant**\n\n{second}\n\n"
    )
    assert Q in (tmp_path / "history").read_text(encoding="utf-8")
    term.close()


def test_keys_typed_during_an_answer_wait_for_the_next_prompt(tmp_path: Path) -> None:
    """Typing while an answer streams: nothing lands in the answer (on screen or in the
    transcript); the keys are at the next prompt, ready to be edited or sent."""
    term = Term(tmp_path, 80, 24, "--faults", "none", "--token-delay", "0.03")
    term.child.send(Q + "\r")
    term.child.expect_exact(answer().split(" ")[2])  # the answer is streaming
    term.child.send("zq")
    term.prompt()
    screen = term.screen()
    assert not any("zq" in line for line in screen if not line.startswith("you>")), screen
    assert screen.count("you> zq") == 1, screen
    term.child.send("\x15")  # Ctrl-U: clear the held keys
    saved = term.save(tmp_path)
    assert "zq" not in saved.split("**assistant**", 1)[1].split("**user**")[0]
    term.close()


def test_no_status_fragment_stays_on_a_narrow_screen(tmp_path: Path) -> None:
    """At 40 columns, a retry then a fallback (their lines are longer than the screen): each
    status line fits one row and is gone once the answer is done; the answer is exact."""
    term = Term(tmp_path, 40, 20, "--faults", "529,at-capacity", "--token-delay", "0")
    term.child.send(Q + "\r")
    term.child.expect_exact("recovered")
    term.prompt()
    assert "Many people are using" in term.raw.getvalue()  # the fallback was shown
    screen = term.screen()
    fragments = ("⟳", "attempt 2)", "switching", "right now", "retrying")
    assert not any(f in line for line in screen for f in fragments), screen
    saved = term.save(tmp_path)
    assert f"**assistant**\n\n{answer()}\n\n" in saved
    term.close()


def test_health_in_chinese(tmp_path: Path) -> None:
    """--lang zh: the prompt, the /health table, its verdicts and their reasons in Chinese."""
    term = Term(
        tmp_path, 160, 24, "--lang", "zh", "--faults", "none", "--token-delay", "0", prompt="你>"
    )
    term.child.send(Q + "\r")
    term.prompt()
    term.child.send("/health\r")
    term.prompt()
    screen = "\n".join(term.screen())
    for word in ("模型", "状态", "请求数", "成功率", "熔断器", "健康", "闭合"):
        assert word in screen, word
    assert "请求太少，尚无法判断" in screen
    assert "healthy" not in screen and "too few" not in screen
    term.close()


def test_save_marks_a_stopped_answer(tmp_path: Path) -> None:
    """Ctrl-C mid-answer: the transcript keeps the partial answer, marked as stopped."""
    term = Term(tmp_path, 80, 24, "--faults", "none", "--token-delay", "0.05")
    term.child.send(Q + "\r")
    term.child.expect_exact(answer().split(" ")[2])
    term.child.sendcontrol("c")
    term.child.expect_exact("[stopped")
    term.prompt()
    saved = term.save(tmp_path)
    partial = saved.split("**assistant**\n\n", 1)[1].split("\n\n", 1)[0]
    assert partial and answer().startswith(partial) and partial != answer()
    assert "*(stopped by the user; partial answer)*" in saved
    term.close()


def test_ctrl_c_while_waiting_says_nothing_arrived(tmp_path: Path) -> None:
    """Ctrl-C during a retry wait, before any text: it says nothing had arrived."""
    term = Term(tmp_path, 80, 24, "--faults", "529:retry-after=30", "--token-delay", "0")
    term.child.send(Q + "\r")
    term.child.expect_exact("retrying")
    term.child.sendcontrol("c")
    term.child.expect_exact("[stopped — nothing had arrived yet]")
    term.prompt()
    term.close()


def test_stats_shows_recovery_per_answer(tmp_path: Path) -> None:
    """/stats: one row per answer with its attempts, resumes and repeated tokens removed."""
    term = Term(tmp_path, 100, 24, "--faults", "reset@10", "--token-delay", "0")
    term.child.send(Q + "\r")
    term.child.expect_exact("recovered")
    term.prompt()
    term.child.send("/stats\r")
    term.prompt()
    rows = [line.split() for line in term.screen() if re.match(r"\s*1\s+ok\b", line)]
    assert rows, term.screen()
    number, outcome, attempts, resumes = rows[-1][:4]
    assert (number, outcome, attempts, resumes) == ("1", "ok", "2", "1")
    term.close()


def test_health_and_stats_stay_readable_at_40_columns(tmp_path: Path) -> None:
    """At 40 columns /health and /stats become one block per row (a table there would show
    every cell as "…"), and a stopped answer counts the attempts it made."""
    term = Term(tmp_path, 40, 40, "--faults", "reset@5", "--token-delay", "0.05")
    term.child.send(Q + "\r")
    term.child.expect_exact(answer().split(" ")[12])  # past the break at token 5: resumed
    term.child.sendcontrol("c")
    term.child.expect_exact("[stopped")
    term.prompt()
    term.child.send("/health\r")
    term.prompt()
    term.child.send("/stats\r")
    term.prompt()
    screen = "\n".join(term.screen())
    assert "demo-large" in screen and "requests: " in screen, screen
    assert "attempts: 2" in screen and "stopped" in screen, screen
    assert not any(line.strip() == "…" or "… …" in line for line in screen.splitlines()), screen
    term.close()
