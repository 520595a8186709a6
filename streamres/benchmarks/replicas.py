"""``streamres bench replicas``: a soak of answers across proxy replicas while the fleet is
knocked about.

Three ``streamres proxy`` processes share one ``redis-server`` in front of the embedded
upstream. People ask questions at a replica picked at random, read a few events, drop, wait,
and read on with ``Last-Event-ID`` at another replica, to the end — a client that honours 503
and ``Retry-After`` and moves on when a replica does not answer. Meanwhile, one at a time and
at random (seeded), the fleet is knocked: a replica killed (SIGKILL) and started again, a
replica stopped for longer than the answers' lease (SIGSTOP, then SIGCONT), Redis restarted
empty, Redis paused past the lease (``CLIENT PAUSE``).

What is checked, per answer: the events a person read across every reconnect are numbered on
(none twice, none missing) and their text is exactly the upstream's answer; and the answer's
log in Redis was written by one producer at a time (each entry begins where the one before
ended) — a part made twice would break that chain. Reported: answers exact, logs with one
writer at a time, upstream requests per answer, and the knocks dealt.

Needs ``redis-server`` and the ``[proxy,redis]`` extras.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx

from streamres import MissingExtra
from streamres._shell.apps import require
from streamres.benchmarks.common import summary
from streamres.benchmarks.table import table
from streamres.upstream import Upstream

__all__ = ["main", "replicas"]

KNOCKS = ("kill", "stall", "redis-restart", "redis-pause")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Redis:
    """A redis-server on a fixed port, to stop and start again (empty)."""

    def __init__(self, exe: str, tmp: Path) -> None:
        self.exe, self.tmp, self.port = exe, tmp, _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: Any = None

    async def start(self) -> None:
        command = [self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        command += ["--appendonly", "no", "--dir", str(self.tmp)]
        self.proc = await anyio.open_process(command, stdout=subprocess.DEVNULL)
        await _listening(self.port)

    async def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            await self.proc.wait()
            await self.proc.aclose()
            self.proc = None


def _appending(path: Path) -> Any:
    return path.open("ab")


async def _listening(port: int) -> None:
    with anyio.fail_after(30):
        while True:
            try:
                stream = await anyio.connect_tcp("127.0.0.1", port)
            except OSError:
                await anyio.sleep(0.05)  # the server starting: nothing to wait on but its port
                continue
            await stream.aclose()
            return


class _Replica:
    """``streamres proxy`` in a child process, on a port it keeps across restarts."""

    def __init__(self, config: Path, redis: str, logs: Path | None) -> None:
        self.config, self.redis, self.port = config, redis, _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: Any = None
        self.logs = logs

    async def start(self) -> None:
        command = [sys.executable, "-m", "streamres", "proxy", "--port", str(self.port)]
        command += ["--config", str(self.config), "--redis", self.redis]
        if self.logs is None:
            self.proc = await anyio.open_process(command, stderr=subprocess.DEVNULL)
        else:
            with _appending(self.logs / f"replica-{self.port}.log") as log:
                command.insert(3, "-v")  # the library's logs, on stderr
                self.proc = await anyio.open_process(command, stderr=log)
        await _listening(self.port)

    async def kill(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            await self.proc.wait()
            await self.proc.aclose()
            self.proc = None


@dataclass
class _Person:
    question: str
    #: What the upstream answers it (what the person must end up reading).
    answer: str
    events: list[dict[str, Any]] = field(default_factory=list)
    #: The answer's id (``x-streamres-answer``).
    id: str = ""
    #: The last refusals it was told (status and words), and whether it gave up waiting.
    refusals: list[str] = field(default_factory=list)
    gave_up: bool = False
    moves: int = 0


def _sse(raw: str) -> list[dict[str, Any]]:
    out = []
    for block in raw.split("\n\n"):
        ev: dict[str, Any] = {"id": None, "data": ""}
        for line in block.split("\n"):
            name, _, value = line.partition(": ")
            if name in ("id", "data"):
                ev[name] = value
        if ev["id"] is not None:
            out.append(ev)
    return out


def _text(events: list[dict[str, Any]]) -> str:
    out = []
    for ev in events:
        if ev["data"].startswith("{"):
            for choice in json.loads(ev["data"]).get("choices", []):
                out.append(choice["delta"].get("content") or "")
    return "".join(out)


async def replicas(
    seconds: float, people: int, seed: int, logs: Path | None = None
) -> dict[str, Any]:
    """The soak (see the module); its figures. ``logs``: where the replicas' logs go."""
    exe = shutil.which("redis-server")
    assert exe is not None  # ``main`` says so in one line
    # The knocks from their own dice (the same knocks each run of a seed); each person's
    # conversation from its own (the same moves, whatever the others' timing).
    rng = random.Random(seed)
    knocks: dict[str, int] = dict.fromkeys(KNOCKS, 0)
    done: list[_Person] = []
    with tempfile.TemporaryDirectory() as tmp:
        redis = _Redis(exe, Path(tmp))
        await redis.start()
        async with Upstream(token_delay=0.03, words=60) as up:
            config = Path(tmp) / "routes.toml"
            config.write_text(
                "[[routes]]\n"
                f'name = "m"\nmodel = "m"\nbase_url = "{up.openai_url}"\n'
                "[answers]\nhold = 2\n",
                encoding="utf-8",
            )
            fleet = [_Replica(config, redis.url, logs) for _ in range(3)]
            for replica in fleet:
                await replica.start()
            try:
                async with httpx.AsyncClient(timeout=httpx.Timeout(10.0)) as http:
                    stop_at = anyio.current_time() + seconds

                    async def person(i: int) -> None:
                        n = 0
                        while anyio.current_time() < stop_at:
                            q = f"Person {i}, question {n}: why do tides rise and fall?"
                            p = _Person(q, up.answer([{"role": "user", "content": q}]))
                            n += 1
                            try:
                                dice = random.Random(f"{seed}:{i}:{n}")
                                await _converse(http, fleet, p, dice)
                            except TimeoutError:
                                p.gave_up = True
                            done.append(p)

                    async def knock() -> None:
                        while anyio.current_time() < stop_at - 8:
                            await anyio.sleep(rng.uniform(2.0, 4.0))
                            kind = rng.choice(KNOCKS)
                            knocks[kind] += 1
                            await _knock(kind, rng.choice(fleet), redis)
                            await anyio.sleep(7.0)  # the fleet settles before the next

                    async with anyio.create_task_group() as tg:
                        tg.start_soon(knock)
                        for i in range(people):
                            tg.start_soon(person, i)
                chains = await _one_writer_each(redis.url, done)
            finally:
                for replica in fleet:
                    await replica.kill()
                await redis.stop()
            asked = [sum(p.question in json.dumps(r.body) for r in up.requests) for p in done]
    wrong = [w for p in done if (w := _wrong(p)) is not None]
    exact = len(done) - len(wrong)
    return {
        "seed": seed,
        "answers": len(done),
        "exact": exact,
        "one_writer_at_a_time": chains,
        "upstream_requests_per_answer": round(sum(asked) / max(1, len(asked)), 2),
        "most_requests_for_one": max(asked, default=0),
        "moves": sum(p.moves for p in done),
        **{f"knock_{k}": v for k, v in knocks.items()},
        "wrong": wrong,
    }


def _wrong(p: _Person) -> dict[str, Any] | None:
    """What is wrong with what ``p`` read (``None``: exact)."""
    numbers = [int(e["id"]) for e in p.events]
    text = _text(p.events)
    if text == p.answer and numbers == list(range(len(numbers))) and not p.gave_up:
        return None
    at = next((i for i, (a, b) in enumerate(zip(text, p.answer, strict=False)) if a != b), None)
    where, so_far = [], 0
    for ev in p.events:  # the events about the first difference, and who sent each
        piece = _text([ev])
        if at is not None and at - 60 <= so_far <= at + 60:
            where.append(f"{ev['id']}@{ev.get('from', '?')}:{piece!r}")
        so_far += len(piece)
    return {
        "around": where,
        "lengths": [len(text), len(p.answer)],
        "answer": p.id,
        "gave_up": p.gave_up,
        "refusals": p.refusals[-3:],
        "numbers": numbers if numbers != list(range(len(numbers))) else "in order",
        "differs_at": at if at is not None else min(len(text), len(p.answer)),
        "read": text[-80:],
        "expected": p.answer[-80:] if len(text) >= len(p.answer) else p.answer[len(text) - 40 :],
    }


async def _converse(
    http: httpx.AsyncClient, fleet: list[_Replica], p: _Person, rng: random.Random
) -> None:
    """Ask at one replica, read a little, drop, and read on elsewhere to the end."""
    messages = [{"role": "user", "content": p.question}]
    body = {"model": "m", "messages": messages, "stream": True}
    answer = None
    with anyio.fail_after(120):
        while answer is None:
            url = rng.choice(fleet).url
            try:
                async with http.stream("POST", url + "/v1/chat/completions", json=body) as r:
                    if r.status_code != 200:
                        p.refusals.append(f"{r.status_code} {(await r.aread())[:200]!r}")
                        await anyio.sleep(0.5)
                        continue
                    answer = p.id = r.headers["x-streamres-answer"]
                    await _read(r, p, rng.randint(1, 12))
            except httpx.HTTPError:
                await anyio.sleep(0.2)  # that replica is down: another
        ended = bool(p.events) and p.events[-1]["data"] == "[DONE]"
        while not ended:
            await anyio.sleep(rng.uniform(0.0, 3.0))  # away a moment, maybe past ``hold``
            p.moves += 1
            url = rng.choice(fleet).url
            headers = {"last-event-id": p.events[-1]["id"]} if p.events else {}
            try:
                async with http.stream(
                    "GET", f"{url}/v1/answers/{answer}/events", headers=headers
                ) as r:
                    if r.status_code == 204:
                        return
                    if r.status_code != 200:  # 503 while shared state settles: again
                        p.refusals.append(f"{r.status_code} {(await r.aread())[:200]!r}")
                        continue
                    await _read(r, p, rng.choice([rng.randint(1, 12), 10_000]))
            except httpx.HTTPError as exc:
                p.refusals.append(f"{type(exc).__name__}")
                continue
            ended = bool(p.events) and p.events[-1]["data"] == "[DONE]"


async def _read(r: httpx.Response, p: _Person, upto: int) -> None:
    buf, got = "", 0
    port = r.url.port
    async for chunk in r.aiter_text():
        buf += chunk
        if "\n\n" not in buf:
            continue
        blocks, _, buf = buf.rpartition("\n\n")
        for ev in _sse(blocks + "\n\n"):
            ev["from"] = port
            p.events.append(ev)
            got += 1
            if got >= upto:
                return


async def _knock(kind: str, replica: _Replica, redis: _Redis) -> None:
    if kind == "kill":
        await replica.kill()
        await replica.start()
    elif kind == "stall":
        replica.proc.send_signal(signal.SIGSTOP)
        await anyio.sleep(4.0)  # past the 3 s lease
        replica.proc.send_signal(signal.SIGCONT)
    elif kind == "redis-restart":
        await redis.stop()
        await redis.start()
    else:
        import coredis

        async with coredis.Redis.from_url(redis.url) as r:
            await r.client_pause(4000, coredis.PureToken.ALL)


async def _one_writer_each(url: str, done: list[_Person]) -> int:
    """Answers whose log in Redis is one chain: each entry begins where the one before ended
    (an answer Redis lost in a restart was written again whole: its new log is the chain)."""
    import coredis

    ok = 0
    async with coredis.Redis.from_url(url, decode_responses=True) as r:
        keys = [k async for k in r.scan_iter(match="*:log")]
        logs = {k.split("{")[1].split("}")[0]: k for k in keys}
        for p in done:
            if p.id not in logs:
                ok += 1  # forgotten (an ended answer past ``keep``): nothing to check
                continue
            at, chained = 0, True
            for entry in await r.xrange(logs[p.id]):
                fields = dict(entry.field_values)
                chained = chained and int(fields["at"]) == at
                at = int(fields["at"]) + len(json.loads(fields["e"]))
            ok += chained
    return ok


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="streamres bench replicas", description=summary(__doc__))
    p.add_argument("--seconds", type=float, default=120.0, help="how long people ask")
    p.add_argument("--people", type=int, default=12, help="people asking at once")
    p.add_argument("--seed", type=int, default=1, help="the knocks' and people's dice")
    p.add_argument("--json", metavar="PATH", help="also write the row as JSON")
    p.add_argument("--logs", metavar="DIR", help="keep the replicas' logs (-v) there")
    args = p.parse_args(argv)
    try:  # what it needs: one line, before anything starts
        require("uvicorn", "streamres bench replicas (its proxies)")
        require("coredis", "streamres bench replicas (its proxies' shared state)")
    except MissingExtra as exc:
        print(f"streamres bench replicas: {exc}", file=sys.stderr)
        return 2
    if shutil.which("redis-server") is None:
        print(
            "streamres bench replicas needs redis-server, which is not on PATH: "
            "apt-get install redis-server",
            file=sys.stderr,
        )
        return 2
    logs = Path(args.logs) if args.logs else None
    row = anyio.run(replicas, args.seconds, args.people, args.seed, logs)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(row, f, indent=1)
    print(f"Answers across three replicas on one Redis, knocked about ({args.seconds:g} s)")
    print(table([{k: v for k, v in row.items() if k != "wrong"}]))
    for w in row["wrong"]:
        print("not exact:", json.dumps(w, ensure_ascii=False))
    return 0 if row["exact"] == row["answers"] == row["one_writer_at_a_time"] else 1
