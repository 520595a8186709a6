"""The package as people install it: each optional part missing answers in one line naming the
``pip install`` that fixes it (from the library and from the CLI, never a traceback); the CLI
refuses what would mislead a newcomer; the embedded upstream behaves as an agent framework
expects. (CI also installs the built wheel with no extras into a clean venv and runs the main
job from it, and once more at the lowest versions the requirements allow.)"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from typing import Any

import jsonschema
import pytest
from rich.console import Console

import streamres
from streamres.chat.render import table
from streamres.upstream import PRESETS, Upstream, parse_faults
from tests.helpers.streams import FAST, USER, collect

ENV = {k: v for k, v in os.environ.items() if not k.endswith(("_API_KEY", "_BASE_URL"))}


def run_without(module: str, code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter where ``module`` cannot be imported."""
    prelude = f"import sys; sys.modules[{module!r}] = None\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + code],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("module", "argv", "extra"),
    [
        ("uvicorn", ["proxy"], "proxy"),
        ("hypercorn", ["proxy", "--server", "hypercorn"], "hypercorn"),
    ],
)
def test_the_proxy_without_its_server_says_what_to_install(
    module: str, argv: list[str], extra: str
) -> None:
    """`streamres proxy` in a plain install: one line with the pip command, exit 2."""
    got = run_without(module, f"from streamres._apps.cli import main; sys.exit(main({argv!r}))")
    assert got.returncode == 2, got.stderr
    assert "Traceback" not in got.stderr
    assert got.stderr.strip().splitlines() == [
        f"streamres proxy: streamres proxy (--server {module}) needs {module}, which is not "
        f"installed: pip install 'streamres[{extra}]'"
    ]


def test_the_proxy_runs_on_uvloop_when_it_can_and_says_so_when_asked_without_it() -> None:
    """``--loop auto`` takes uvloop where ``streamres[proxy]`` installed it, asyncio's own loop
    where it is not; ``--loop uvloop`` without it is one line with the pip command, exit 2."""
    from streamres.proxy import event_loop

    assert event_loop("auto") == {"use_uvloop": True}  # the test environment has the extra
    assert event_loop("asyncio") == {"use_uvloop": False}
    without = run_without(
        "uvloop", "from streamres.proxy import event_loop; print(event_loop('auto'))"
    )
    assert without.stdout.strip() == "{'use_uvloop': False}", without.stderr
    argv = ["proxy", "--loop", "uvloop"]
    got = run_without("uvloop", f"from streamres._apps.cli import main; sys.exit(main({argv!r}))")
    assert got.returncode == 2 and "Traceback" not in got.stderr
    assert got.stderr.strip().splitlines() == [
        "streamres proxy: streamres proxy --loop uvloop needs uvloop, which is not installed: "
        "pip install 'streamres[proxy]' (or --loop asyncio)"
    ]


@pytest.mark.parametrize(
    ("module", "code", "extra"),
    [
        (
            "coredis",
            "streamres.Client([streamres.Route('m', base_url='http://x/v1')], "
            "shared='redis://127.0.0.1:1/0')",
            "shared",
        ),
        (
            "wordllama",
            "streamres.Client([streamres.Route('m', base_url='http://x/v1')], "
            "cache=streamres.Cache(semantic=streamres.Semantic()))",
            "semantic",
        ),
        ("prometheus_client", "import streamres.prometheus", "prometheus"),
    ],
)
def test_the_library_names_the_missing_extra(module: str, code: str, extra: str) -> None:
    """Shared state, the semantic cache, Prometheus: a MissingExtra (a StreamError and an
    ImportError) whose message ends in the pip line."""
    got = run_without(
        module,
        "import streamres\n"
        f"try:\n    {code}\n"
        "except streamres.MissingExtra as exc:\n"
        "    assert isinstance(exc, ImportError) and isinstance(exc, streamres.StreamError)\n"
        "    print(exc.extra, '|', exc)\n",
    )
    assert got.returncode == 0, got.stderr
    said_extra, message = got.stdout.strip().split(" | ")
    assert said_extra == extra
    assert f"pip install 'streamres[{extra}]'" in message and "not installed" in message


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The CLI's main, leaving the process's logging alone (the app configures its own)."""
    from streamres._apps import cli

    monkeypatch.setattr(cli, "_configure_logs", lambda verbose: None)
    return cli.main


def test_proxy_faults_take_the_presets_and_refuse_a_bad_plan(
    capsys: pytest.CaptureFixture[str], cli: Any
) -> None:
    """`proxy --faults light` is the preset the README lists; a bad plan is one line, exit 2."""
    from streamres.proxy.server.serve import embedded_models

    plan = embedded_models("light")["demo-large"].faults
    assert plan is not None and list(plan.queue) == parse_faults(PRESETS["light"])
    assert cli(["proxy", "--faults", "bogus"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("streamres proxy: unknown fault 'bogus'") and err.count("\n") == 1


def test_ask_with_a_bad_base_url_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], cli: Any
) -> None:
    """A base URL that is not http(s) was refused before anything was sent: exit 2."""
    assert cli(["ask", "--base-url", "notaurl", "hi"]) == 2
    assert "base_url must be an http:// or https:// URL" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags",
    [["--model", "gpt-4o"], ["--provider", "anthropic"], ["--model", "demo-large", "--model", "x"]],
)
def test_a_real_model_without_a_key_is_not_answered_by_the_demo(flags: list[str]) -> None:
    """`ask --model gpt-4o` with no key and no base URL: refused with what to set (the demo's
    canned text must never pass for gpt-4o); with --embedded it is the demo, on purpose."""
    cmd = [sys.executable, "-m", "streamres", "ask", *flags, "--faults", "none", "hi"]
    got = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=60, check=False)
    assert got.returncode == 2 and not got.stdout
    key = "ANTHROPIC_API_KEY" if "anthropic" in flags else "OPENAI_API_KEY"
    assert f"set {key}" in got.stderr and "--embedded" in got.stderr
    demo = subprocess.run(
        [*cmd[:-1], "--embedded", "--token-delay", "0", "hi"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=60,
        check=False,
    )
    assert demo.returncode == 0, demo.stderr
    assert "[embedded upstream:" in demo.stderr


def test_help_says_each_default_once() -> None:
    """A help text that states its default is not followed by argparse's own."""
    got = subprocess.run(
        [sys.executable, "-m", "streamres", "chat", "--help"],
        capture_output=True,
        text=True,
        env={**ENV, "COLUMNS": "300"},
        timeout=60,
        check=False,
    )
    assert "(default: from the locale)" in got.stdout
    assert all(line.count("(default:") <= 1 for line in got.stdout.splitlines())
    assert "(default: None)" not in got.stdout


def test_tables_fit_or_become_blocks() -> None:
    """Wide enough: a table; at 40 columns: one block per row, every value whole."""
    heads = ["model", "health", "requests", "success", "capacity", "stalls", "ttft", "latency"]
    row = ["demo-large", "healthy", "12", "92%", "1", "0", "0.21s", "3.40s"]

    def shown(width: int) -> str:
        out = io.StringIO()
        Console(file=out, width=width, no_color=True).print(table(heads, [row], wrap_last=False))
        return out.getvalue()

    wide = shown(120)
    assert wide.splitlines()[0].split() == heads
    narrow = shown(40)
    assert "…" not in narrow
    assert all(len(line) <= 40 for line in narrow.splitlines())
    assert [line.strip() for line in narrow.splitlines()] == [
        "demo-large",
        *(f"{h}: {v}" for h, v in zip(heads[1:], row[1:], strict=True)),
    ]


# -- the embedded upstream as an agent framework meets it --------------------------------------

SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    {
        "type": "object",
        "properties": {
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
            "detailed": {"type": "boolean"},
            "where": {
                "type": "object",
                "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                "required": ["lat", "lon"],
                "additionalProperties": False,
            },
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
            "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        },
        "required": ["unit", "days", "where", "tags", "note"],
        "additionalProperties": False,
    },
]


def tool(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": schema}}


@pytest.mark.anyio
@pytest.mark.parametrize("schema", SCHEMAS)
async def test_tool_arguments_fit_the_tools_schema(schema: dict[str, Any]) -> None:
    """The arguments of each call validate against the tool's own JSON schema."""
    async with Upstream() as up:
        _text, _events, done = await collect(
            streamres.stream_resilient(
                USER,
                model="m",
                base_url=up.openai_url,
                api_key="k",
                tools=[tool("get_weather", schema)],
                backoff=FAST,
            )
        )
    (call,) = done.tool_calls
    jsonschema.validate(json.loads(call.arguments), schema)


@pytest.mark.anyio
async def test_a_tool_result_is_answered_in_text_so_the_agent_loop_ends() -> None:
    """After the tool's result the model answers in words, with no new call."""
    weather = tool("get_weather", SCHEMAS[0])
    async with Upstream() as up:

        async def turn(messages: list[dict[str, Any]]) -> tuple[str, streamres.DoneEvent]:
            text, _events, done = await collect(
                streamres.stream_resilient(
                    messages,
                    model="m",
                    base_url=up.openai_url,
                    api_key="k",
                    tools=[weather],
                    backoff=FAST,
                )
            )
            return text, done

        _, first = await turn(USER)
        (call,) = first.tool_calls
        asked = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
            ],
        }
        result = {"role": "tool", "tool_call_id": call.id, "content": "18 °C, cloudy"}
        text, second = await turn([*USER, asked, result])
    assert first.finish_reason == "tool_calls"
    assert second.finish_reason == "stop" and second.tool_calls == () and text


def han_share(text: str) -> float:
    return sum("\u4e00" <= ch <= "\u9fff" for ch in text) / max(1, len(text))


def test_the_answer_is_in_the_language_of_the_last_question() -> None:
    """A Chinese question, then an English one: the English one is answered in English (the
    English answers mix in a little of other scripts on purpose), and back."""
    from streamres.upstream import answer_for

    chinese = [{"role": "user", "content": "解释蜜蜂的舞蹈。"}]
    english = [*chinese, {"role": "assistant", "content": "蜜蜂……"}, *USER]
    back = [
        *english,
        {"role": "assistant", "content": "..."},
        {"role": "user", "content": "再说一遍"},
    ]
    assert han_share(answer_for(chinese)) > 0.5
    assert han_share(answer_for(english)) < 0.1
    assert han_share(answer_for(back)) > 0.5
