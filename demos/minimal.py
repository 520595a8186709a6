"""The smallest UI integration: print the answer as it streams, and each status line.

Runs offline against the embedded upstream with a few faults:

    python demos/minimal.py
"""

from __future__ import annotations

import anyio

import streamres
from streamres.upstream import Upstream


async def main() -> None:
    messages = [{"role": "user", "content": "Explain TCP slow start."}]
    async with Upstream(faults="529:retry-after=0.5,reset@30", token_delay=0.01) as up:
        async for ev in streamres.stream_resilient(
            messages, model="demo", base_url=up.openai_url, api_key="demo", deadline=60
        ):
            match ev.type:
                case "text":
                    print(ev.text, end="", flush=True)
                case "thinking" | "tool_call":
                    pass  # reasoning and tool calls, when a model sends them
                case "done":
                    print(f"\n[{ev.finish_reason}, attempts: {ev.attempts}, resumes: {ev.resumes}]")
                case _:
                    print(f"\n[{ev.message}]")  # retry / resume / fallback


if __name__ == "__main__":
    anyio.run(main)
