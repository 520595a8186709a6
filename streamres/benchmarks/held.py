"""``streamres bench held``: what a held answer costs the proxy's memory, per character.

The embedded upstream (its own process) answers ``--words`` words, each token its own flushed
write (``--framing event``, as a model streams) or coalesced at full speed (``batched``);
``streamres proxy`` (its own process, answers kept an hour) holds every answer it streamed.
Per API, ``--answers`` answers are read whole, then the proxy's resident memory (``VmRSS``)
is read again: its growth per character held, beside what the proxy counts the answers as
weighing (``streamres_proxy_answers_held_bytes``, what ``[answers] max_bytes`` bounds), the
answers' SSE encoding per character, and the ratio of the count to the growth.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import anyio
import httpx

from streamres.benchmarks.common import summary
from streamres.benchmarks.proxy import _peak_rss_mib, _process
from streamres.benchmarks.table import table
from streamres.upstream import answer_for

__all__ = ["main"]

_PATHS = {
    "openai": "/v1/chat/completions",
    "anthropic": "/v1/messages",
    "responses": "/v1/responses",
}


def _body(api: str, question: str) -> dict[str, Any]:
    if api == "responses":
        return {"model": "m", "stream": True, "input": question}
    body: dict[str, Any] = {"model": "m", "stream": True}
    body["messages"] = [{"role": "user", "content": question}]
    if api == "anthropic":
        body["max_tokens"] = 100_000
    return body


@contextlib.contextmanager
def _proxy(upstream: str) -> Iterator[tuple[str, int]]:
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write("[answers]\nkeep = 3600\nmax_answers = 100000\nmax_bytes = 8000000000\n")
        f.write("max_bytes_per_key = 8000000000\n")
        f.write(f'[[routes]]\nname = "m"\nmodel = "m"\nbase_url = "{upstream}/v1"\n')
        path = f.name
    try:
        argv = [sys.executable, "-m", "streamres", "proxy", "--port", "0", "--config", path]
        with _process(argv, "streamres proxy on") as got:
            yield got
    finally:
        os.unlink(path)


async def _held_bytes(http: httpx.AsyncClient) -> float:
    text = (await http.get("/metrics")).text
    line = next(x for x in text.splitlines() if x.startswith("streamres_proxy_answers_held_bytes"))
    return float(line.split()[-1])


async def _one(api: str, framing: str, words: int, answers: int) -> dict[str, Any]:
    serve = [sys.executable, "-m", "streamres", "serve", "--port", "0", "--words", str(words)]
    with (
        _process([*serve, "--framing", framing], "embedded upstream") as (up, _),
        _proxy(up) as (url, pid),
    ):
        async with httpx.AsyncClient(base_url=url, timeout=120) as http:
            for i in range(3):  # the process's one-time allocations first
                await http.post(_PATHS[api], json=_body(api, f"warm up {i}"))
            before, counted = _peak_rss_mib(pid, "VmRSS"), await _held_bytes(http)
            chars = wire = 0
            for i in range(answers):
                question = f"Question {i}: how does TCP slow start work?"
                r = await http.post(_PATHS[api], json=_body(api, question))
                wire += len(r.content)
                chars += len(answer_for([{"role": "user", "content": question}], words=words))
            grown = (_peak_rss_mib(pid, "VmRSS") - before) * 2**20
            counted = await _held_bytes(http) - counted
    return {
        "api": api,
        "framing": framing,
        "answers": answers,
        "chars_each": chars // answers,
        "rss_bytes_per_char": grown / chars,
        "counted_bytes_per_char": counted / chars,
        "sse_bytes_per_char": wire / chars,
        "counted_over_rss": counted / grown if grown > 0 else float("nan"),
    }


async def _run(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for framing in args.framing:
        for api in args.apis:
            row = await _one(api, framing, args.words, args.answers)
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
    return rows


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="streamres bench held", description=summary(__doc__))
    p.add_argument("--answers", type=int, default=100, help="answers held per run (100)")
    p.add_argument("--words", type=int, default=2000, help="words an answer (2,000)")
    p.add_argument("--apis", nargs="+", default=list(_PATHS), choices=list(_PATHS))
    framings = ["event", "batched"]
    p.add_argument("--framing", nargs="+", default=framings, choices=framings)
    p.add_argument("--json", default="", help="also write the rows here")
    args = p.parse_args(argv)
    rows = anyio.run(_run, args)
    print("Memory per held character (the embedded upstream's text: English with some accents,")
    print("Chinese and emoji; one proxy process; answers read whole and kept)")
    print(table(rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=2)
    return 0
