"""The coding agents and the AI SDK as their users run them, offline, against ``streamres proxy``
through the embedded upstream's fault storm: Claude Code (its native binary, default toolset,
under its default model name and under ``chat``), Codex (default features, ``wire_api =
"responses"``) and the Vercel AI SDK's Chat, Responses and Anthropic providers — the npm
packages ``tests/node`` pins. Each runs to its end; every answer it was sent is recorded on the
wire and replayed to a fault-free proxy, and must be the same, character for character, tool
calls included.

Claude Code's agent loop offers its tools to a model that calls the first two (its ``Agent``
and ``Bash``): the sub-agent runs, and ``Bash`` is refused by Claude Code's own permissions in
``-p`` mode. Codex's model calls ``exec_command`` with words of its answer, which Codex runs in
its read-only sandbox in a scratch directory (``command not found``)."""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from streamres.proxy.server.serve import Running, embedded_config, running, storm
from streamres.upstream import Upstream
from tests.helpers.agents import (
    Exchange,
    answer_of,
    claude_binary,
    codex_binary,
    record,
    replayed,
)
from tests.helpers.node import node_env

pytestmark = pytest.mark.anyio

#: Model names the agents send at their defaults, mapped to the embedded chain.
AGENT_NAMES = ("claude-opus-4-8",)
QUESTION = "Explain TCP slow start."


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the proxy serves on asyncio (uvicorn)


@contextlib.asynccontextmanager
async def _proxies(seed: int) -> AsyncIterator[tuple[Running, Running, Upstream]]:
    """A proxy in front of the storm, and a fault-free one to replay to."""
    async with (
        Upstream(models=storm(seed), token_delay=0) as up,
        Upstream(token_delay=0) as calm,
    ):
        configs = [embedded_config(up), embedded_config(calm)]
        for config in configs:
            for name in AGENT_NAMES:
                config.models[name] = list(config.models["chat"])
        async with running(configs[0], port=0) as run, running(configs[1], port=0) as clean:
            yield run, clean, up


async def _same_as_fault_free(seen: list[Exchange], path: str, clean: Running) -> list[str]:
    """Every answer the client was sent on ``path``: a 200, and the same as the fault-free
    proxy's answer to the same request. Returns their texts, in order."""
    asked = [ex for ex in seen if ex.method == "POST" and ex.path == path]
    assert asked and all(ex.status == 200 for ex in asked), [
        (e.status, e.response[:200]) for e in asked
    ]
    texts = []
    for ex, again in await replayed(asked, clean.url):
        got, want = answer_of(ex.response), answer_of(again)
        assert got == want
        assert got[0] or got[1]  # an answer: text or calls
        texts.append(got[0])
    return texts


def _lines(out: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]


@pytest.mark.parametrize(("model", "seed"), [(None, 7), ("chat", 11)])
async def test_claude_code_at_its_defaults_through_the_storm(
    model: str | None, seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its default toolset and agent loop (with no ``--model``, its default name), through the
    storm: it completes, and every answer is the fault-free one."""
    binary = claude_binary()
    home = tmp_path / "home"
    home.mkdir()
    async with _proxies(seed) as (run, clean, up):
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(home),
            "ANTHROPIC_BASE_URL": run.url,
            "ANTHROPIC_API_KEY": "sk-local",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1",
        }
        args = [str(binary), "-p", QUESTION, "--output-format", "stream-json", "--verbose"]
        args += ["--no-session-persistence", *(["--model", model] if model else [])]
        with record(run.proxy, monkeypatch) as seen, anyio.fail_after(300):
            done = await anyio.run_process(
                args, env=env, cwd=tmp_path, stdin=subprocess.DEVNULL, check=False
            )
        events = _lines(done.stdout)
        result = events[-1]
        assert done.returncode == 0 and result["type"] == "result", done.stdout[-2000:]
        assert not result["is_error"], result["result"]
        texts = await _same_as_fault_free(seen, "/v1/messages", clean)
        answered = sum(1 for ex in seen if ex.path == "/v1/messages")
    assert answered >= 3  # a tool round, the sub-agent's answer, the last answer
    assert len(up.requests) > answered  # the storm was met: retried, resumed, fallen back
    assert result["result"] == texts[-1]


async def test_codex_with_default_features_through_the_storm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its ten tools (a namespace and web search among them) on a Chat route, through the
    storm: the turn completes, and every answer is the fault-free one."""
    binary = codex_binary()
    home, work = tmp_path / "home", tmp_path / "work"
    (home / ".codex").mkdir(parents=True)
    work.mkdir()
    async with _proxies(5) as (run, clean, up):
        (home / ".codex" / "config.toml").write_text(
            'model = "chat"\nmodel_provider = "streamres"\n\n[model_providers.streamres]\n'
            f'name = "streamres"\nbase_url = "{run.url}/v1"\nwire_api = "responses"\n'
            'env_key = "STREAMRES_KEY"\n',
            encoding="utf-8",
        )
        env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "STREAMRES_KEY": "sk-local"}
        args = [str(binary), "exec", "--ephemeral", "--skip-git-repo-check", "--json", QUESTION]
        with record(run.proxy, monkeypatch) as seen, anyio.fail_after(300):
            done = await anyio.run_process(
                args, env=env, cwd=work, stdin=subprocess.DEVNULL, check=False
            )
        events = _lines(done.stdout)
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        assert events[-1]["type"] == "turn.completed", events[-3:]
        texts = await _same_as_fault_free(seen, "/v1/responses", clean)
        first = json.loads(next(ex.body for ex in seen if ex.path == "/v1/responses"))
        answered = sum(1 for ex in seen if ex.path == "/v1/responses")
    kinds = [t["type"] for t in first["tools"]]
    assert "namespace" in kinds and "web_search" in kinds  # its defaults, as sent
    assert len(up.requests) > answered
    said = [e["item"]["text"] for e in events if e.get("item", {}).get("type") == "agent_message"]
    assert said and said[-1] == texts[-1]


#: The AI SDK's three providers, each streaming an answer that calls a tool, then the answer
#: to the tool's result; printed as JSON lines.
AI_SDK = r"""
const { streamText, tool, jsonSchema, stepCountIs } = require("ai");
const { createOpenAICompatible } = require("@ai-sdk/openai-compatible");
const { createOpenAI } = require("@ai-sdk/openai");
const { createAnthropic } = require("@ai-sdk/anthropic");
const base = process.argv[2];
const models = {
  compatible: createOpenAICompatible({ name: "proxy", baseURL: base + "/v1", apiKey: "k" })("chat"),
  responses: createOpenAI({ baseURL: base + "/v1", apiKey: "k" }).responses("chat"),
  chat: createOpenAI({ baseURL: base + "/v1", apiKey: "k" }).chat("chat"),
  anthropic: createAnthropic({ baseURL: base + "/v1", apiKey: "k" })("chat"),
};
const weather = tool({
  description: "The weather in a city",
  inputSchema: jsonSchema({ type: "object", properties: { city: { type: "string" } }, required: ["city"] }),
  execute: async ({ city }) => `18 °C in ${city}`,
});
(async () => {
  const result = streamText({
    model: models[process.argv[3]],
    prompt: "What is the weather in Paris?",
    tools: { weather },
    stopWhen: stepCountIs(3),
    maxRetries: 0,
  });
  let text = "";
  for await (const part of result.fullStream) {
    if (part.type === "text-delta") text += part.text;
    if (part.type === "error") { console.log(JSON.stringify({ error: String(part.error) })); process.exit(1); }
  }
  const steps = await result.steps;
  console.log(JSON.stringify({ text, steps: steps.map((s) => ({ text: s.text, calls: s.toolCalls.map((c) => c.toolName) })) }));
})().catch((e) => { console.log(JSON.stringify({ error: String(e) })); process.exit(1); });
"""


@pytest.mark.parametrize(
    ("provider", "path"),
    [
        ("compatible", "/v1/chat/completions"),
        ("chat", "/v1/chat/completions"),
        ("responses", "/v1/responses"),
        ("anthropic", "/v1/messages"),
    ],
)
async def test_the_ai_sdk_through_the_storm(
    provider: str, path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``streamText`` with a tool, two steps, no retries of its own: each step's answer is the
    fault-free one, and the SDK's text is the last answer's."""
    env = node_env("ai", "@ai-sdk/openai-compatible", "@ai-sdk/openai", "@ai-sdk/anthropic")
    script = tmp_path / "sdk.js"
    script.write_text(AI_SDK, encoding="utf-8")
    async with _proxies(3) as (run, clean, up):
        with record(run.proxy, monkeypatch) as seen, anyio.fail_after(240):
            done = await anyio.run_process(
                ["node", str(script), run.url, provider], env=env, check=False
            )
        out = _lines(done.stdout)[-1]
        assert done.returncode == 0 and "error" not in out, out
        texts = await _same_as_fault_free(seen, path, clean)
    assert [s["calls"] for s in out["steps"]] == [["weather"], []]
    assert out["steps"][-1]["text"] == texts[-1]
    assert len(up.requests) > len(texts)
