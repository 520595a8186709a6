"""The streamres command, run as a user runs it."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from streamres.upstream import answer_for

ENV = {k: v for k, v in os.environ.items() if not k.endswith(("_API_KEY", "_BASE_URL"))}


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamres", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
        input=stdin,
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


@pytest.mark.parametrize("command", ["ask", "serve"])
def test_help_describes_every_option_with_its_default(command: str) -> None:
    """`ask --help` and `serve --help` say what the command does and each option's default."""
    got = run(command, "--help")
    assert got.returncode == 0
    assert "embedded upstream" in got.stdout
    assert "(default: " in got.stdout
    options = [line for line in got.stdout.splitlines() if line.strip().startswith("--")]
    assert options and all(len(line.split()) > 1 for line in options)  # each explained


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["ask", "q", "--words", "-5"], "-5 is not a positive integer"),
        (["ask", "q", "--token-delay", "-1"], "-1 is not a number of seconds >= 0"),
        (["ask", "q", "--deadline", "soon"], "'soon' is not a positive number of seconds"),
        (["serve", "--port", "70000"], "not a port number"),
        (["ask"], "ask needs a QUESTION"),
    ],
)
def test_bad_values_are_one_line_usage_errors(args: list[str], words: str) -> None:
    """A bad value: exit 2, one line naming it, no usage dump, no traceback."""
    got = run(*args)
    assert got.returncode == 2
    assert words in got.stderr
    assert len(got.stderr.strip().splitlines()) == 1, got.stderr


def test_serve_on_a_busy_port_is_one_line() -> None:
    """`serve` on a port that is taken: exit 2 and one line saying so."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        got = run("serve", "--port", str(taken.getsockname()[1]))
    assert got.returncode == 2
    assert "cannot listen on 127.0.0.1" in got.stderr and "another --port" in got.stderr
    assert len(got.stderr.strip().splitlines()) == 1 and "Traceback" not in got.stderr


def test_proxy_on_a_busy_port_is_one_line() -> None:
    """`proxy` on a port that is taken: exit 2 and one line saying so, as `serve` does (not
    the ASGI server's own error line and exit 3)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        got = run("proxy", "--port", str(taken.getsockname()[1]))
    assert got.returncode == 2, got.stderr
    assert "streamres proxy: cannot listen on 127.0.0.1" in got.stderr
    assert "another --port" in got.stderr and "Errno" not in got.stderr
    assert len(got.stderr.strip().splitlines()) == 1


def test_proxy_workers_on_a_busy_port_is_one_line(tmp_path: Path) -> None:
    """`proxy --workers 2` on a port that is taken: exit 2 and the same one line, before any
    banner says it serves (not the banner, then the server's raw error and exit 3)."""
    pytest.importorskip("uvicorn")
    routes = tmp_path / "routes.toml"
    routes.write_text('[[routes]]\nname = "m"\nmodel = "m"\nbase_url = "http://127.0.0.1:9/v1"\n')
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        got = run("proxy", "--workers", "2", "--config", str(routes), "--port", port)
    assert got.returncode == 2, got.stderr
    assert got.stdout == ""  # no banner
    assert "streamres proxy: cannot listen on 127.0.0.1" in got.stderr
    assert "another --port" in got.stderr and "Errno" not in got.stderr
    assert len(got.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(("typo", "meant"), [("strom", "storm"), ("resett@40", "reset")])
def test_a_misspelt_fault_plan_gets_a_suggestion(typo: str, meant: str) -> None:
    """A fault plan one letter off names the plan that was meant."""
    got = run("ask", "q", "--faults", typo)
    assert got.returncode == 2
    assert f"did you mean {meant!r}?" in got.stderr


def test_ask_reads_a_long_question_from_stdin_and_from_a_file(tmp_path: Path) -> None:
    """`ask -` reads standard input; `ask --file` a file: the same answer as the argument."""
    question = "Explain TCP slow start. " * 200
    expected = answer_for([{"role": "user", "content": question}], words=120)
    piped = run("ask", "-", "--faults", "none", "--token-delay", "0", stdin=question)
    path = tmp_path / "q.txt"
    path.write_text(question, encoding="utf-8")
    filed = run("ask", "--file", str(path), "--faults", "none", "--token-delay", "0")
    assert piped.returncode == filed.returncode == 0, piped.stderr + filed.stderr
    assert piped.stdout == filed.stdout == expected + "\n"


def test_failures_print_no_log_lines_without_verbose() -> None:
    """A failure is said once, by the command; library log lines only with -v."""
    quiet = run("ask", "q", "--faults", "401", "--token-delay", "0")
    loud = run("-v", "ask", "q", "--faults", "401", "--token-delay", "0")
    assert quiet.returncode == loud.returncode == 1
    assert "streamres.failed" not in quiet.stderr and "[failed:" in quiet.stderr
    assert "streamres.failed" in loud.stderr


def test_counts_are_worded_in_the_singular_and_the_plural() -> None:
    """ "1 resume", "2 attempts": no "1 resumes", no "attempt(s)"."""
    got = run("ask", "q", "--faults", "reset@10", "--token-delay", "0")
    assert got.returncode == 0, got.stderr
    assert "2 attempts, 1 resume," in got.stderr and "(s)" not in got.stderr


@pytest.mark.parametrize("command", ["proxy", "batch", "chat"])
def test_verbose_before_any_command_is_no_traceback(command: str) -> None:
    """``streamres -v COMMAND`` works for every command (a bad value is its one-line usage
    error, never a traceback from the top-level parser)."""
    bad = {"proxy": ["--faults", "bogus"], "batch": ["x.jsonl"], "chat": ["--words", "0"]}
    done = run("-v", command, *bad[command])
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.strip()


def test_the_batch_progress_keeps_its_bar_count_and_time_left_on_a_narrow_terminal() -> None:
    """On an 80-column terminal, with every model's state to tell, the progress line still
    shows its bar, the count done and the time left; the state is cut with an ellipsis."""
    import io

    from rich.console import Console

    import streamres
    from streamres._apps.batch_cli import _Live

    class Client:  # the health the line reports: two models, both jammed
        def health(self) -> dict[str, Any]:
            jammed = type("H", (), {"status": "jammed"})()
            return {"a-model-with-a-long-name": jammed, "another-long-model-name": jammed}

    out = io.StringIO()
    console = Console(file=out, width=80, force_terminal=True, color_system=None)
    live = _Live(console, Client())  # type: ignore[arg-type]
    live(streamres.BatchProgress(10, 3, 1, 0, 4, 2, 12345, 7.5, paused="a jammed model"))
    console.print(live.progress.get_renderable())
    line = out.getvalue().strip().splitlines()[0]
    assert "━" in line and "…" in line
    assert re.search(r"4/10 (\d+:\d\d:\d\d|-:--:--) 4 in flight", line), line


def test_a_batch_that_tried_nothing_says_so() -> None:
    """Every line already answered by an earlier run: the summary says none was tried, not
    "100.0 % of those tried"."""
    import streamres
    from streamres._apps.batch_cli import _summary

    lines: list[str] = []
    summary = streamres.BatchSummary(5, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0.1)
    _summary(summary, lines.append)
    assert "none was tried" in lines[0] and "%" not in lines[0]


def test_a_claude_model_named_without_a_key_asks_for_the_anthropic_key() -> None:
    """``--model claude-…`` with no key or base URL: the refusal names ANTHROPIC_API_KEY, the
    key that model needs, not OpenAI's."""
    got = run("ask", "--model", "claude-sonnet-4-5", "Explain TCP slow start.")
    assert got.returncode == 2
    assert "model claude-sonnet-4-5 is a real service" in got.stderr
    assert "set ANTHROPIC_API_KEY" in got.stderr and "OPENAI_API_KEY" not in got.stderr
