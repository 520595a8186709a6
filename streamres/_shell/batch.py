"""Run a batch of requests through a :class:`~streamres.Client`: low priority, paced, resumable.
I/O shell (the rules are ``_core/jobs``): reads the requests, appends one result line per
finished answer, and waits — for a slot, for health, for the window — with anyio.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import anyio

from streamres._core.errors import InvalidRequest, StreamError
from streamres._core.events import DoneEvent
from streamres._core.jobs import BadLine, Job, Pace, Window, finished, parse_jobs, record
from streamres._core.lanes import LOW, check_priority
from streamres._shell.client import Client
from streamres._shell.limits import account_of

__all__ = ["BatchProgress", "BatchSummary", "run_batch"]

_CAPACITY = frozenset({"capacity", "rate_limit"})
#: Seconds between two looks at the fleet's health while the batch is paused.
_RECHECK = 1.0


@dataclass(frozen=True)
class BatchProgress:
    """Where a batch stands (``on_progress`` gets one at every change)."""

    total: int
    done: int
    failed: int
    #: Answered by an earlier run (read from the results file), not sent again.
    skipped: int
    in_flight: int
    #: Not started yet.
    waiting: int
    tokens: int
    elapsed: float
    #: Why no new work starts now ("" when it does): a jammed model, the window, capacity.
    paused: str = ""
    #: The record just written, if this change is an answer.
    last: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class BatchSummary:
    """What a batch run did. ``failures``: (id, line, message) of every request that failed,
    bad lines included."""

    total: int
    answered: int
    failed: int
    skipped: int
    attempts: int
    retries: int
    resumes: int
    fallbacks: int
    input_tokens: int
    output_tokens: int
    wall: float
    bad_lines: tuple[BadLine, ...] = ()
    failures: tuple[tuple[str, int, str], ...] = ()
    #: Where the failed requests of an OpenAI Batch input are written, as OpenAI writes them
    #: to a batch's error file ("" when this run wrote none there).
    errors_file: str = ""

    @property
    def success_rate(self) -> float:
        """Answered over everything this run tried (skipped ones excluded)."""
        tried = self.answered + self.failed
        return self.answered / tried if tried else 1.0

    @property
    def ok(self) -> bool:
        return not self.failed and not self.bad_lines


@dataclass
class _Run:
    pace: Pace
    total: int
    skipped: int
    started: float
    done: int = 0
    failed: int = 0
    in_flight: int = 0
    tokens: int = 0
    attempts: int = 0
    retries: int = 0
    resumes: int = 0
    fallbacks: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    paused: str = ""
    failures: list[tuple[str, int, str]] = field(default_factory=list)
    changed: anyio.Event = field(default_factory=anyio.Event)

    def wake(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()


def _read_lines(source: str | os.PathLike[str] | Iterable[str]) -> list[str]:
    if isinstance(source, (str, os.PathLike)):
        try:
            with open(source, encoding="utf-8") as f:
                return f.read().splitlines()
        except OSError as exc:
            raise InvalidRequest(
                f"cannot read the requests {os.fspath(source)!r}: {exc.strerror or exc}",
                reason="invalid",
            ) from None
        except UnicodeDecodeError as exc:
            raise InvalidRequest(
                f"the requests {os.fspath(source)!r} are not UTF-8 text ({exc.reason} at byte "
                f"{exc.start})",
                reason="invalid",
            ) from None
    return list(source)


def _previous(path: str) -> tuple[dict[str, dict[str, Any]], bool]:
    """The records an earlier run left, and whether the file ends mid-line (torn)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return {}, False
    except OSError as exc:
        raise InvalidRequest(
            f"cannot read the results {path!r}: {exc.strerror or exc}", reason="invalid"
        ) from None
    records, _ = finished(data.decode("utf-8", "replace").splitlines())
    return records, bool(data) and not data.endswith(b"\n")


def _beside(path: str, tag: str) -> str:
    """``path`` with ``tag`` before its suffix (``out.jsonl`` → ``out.errors.jsonl``)."""
    root, ext = os.path.splitext(path)
    return f"{root}{tag}{ext}"


def _drop_lines(path: str, ids: set[str]) -> None:
    """Rewrite the error file at ``path`` without the lines of ``ids`` (tried again now); a
    torn last line goes too. Nothing to do when there is no such file."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidRequest(
            f"cannot read the error file {path!r}: {exc}", reason="invalid"
        ) from None
    kept = []
    for text in lines:
        try:
            rec = json.loads(text)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("custom_id") not in ids:
            kept.append(text + "\n")
    with open(path + ".tmp", "w", encoding="utf-8") as f:  # whole, or not at all
        f.writelines(kept)
    os.replace(path + ".tmp", path)


def _default_concurrency(client: Client) -> int:
    """As many as the routes' limits let through at once, or 8 without limits."""
    accounts = client._account_limits
    slots = sum(accounts.values()) + sum(
        r.max_in_flight or 0 for r in client.routes if account_of(r) not in accounts
    )
    return slots or 8


def _chain(client: Client, job: Job, models: Mapping[str, Sequence[str]]) -> list[str]:
    """The route names a job may use (for the health check): its model's chain, or all."""
    if job.model is None:
        return [r.key for r in client.routes]
    names = list(models.get(job.model, [job.model]))
    fleet = client.fleet
    found = [i for n in names if (i := fleet.by_key.get(n)) is not None]
    if not found:
        return names
    chain = fleet.chain(names if len(names) > 1 else names[0], fallback=True, rand=0.0)
    return [fleet.routes[i].key for i in chain]


def _health_gate(client: Client, names: list[str]) -> tuple[str, bool]:
    """Why new work waits ("" if it need not), and whether a model it may use is degrading."""
    health = client.health()
    known = [n for n in names if n in health]
    degrading = any(health[n].status == "degrading" for n in known)
    if known and all(health[n].status == "jammed" for n in known):
        reasons = health[known[0]].reasons
        return f"{', '.join(known)} jammed" + (f" ({reasons[0]})" if reasons else ""), degrading
    return "", degrading


async def run_batch(
    client: Client,
    requests: str | os.PathLike[str] | Iterable[str],
    results: str | os.PathLike[str],
    *,
    concurrency: int | None = None,
    priority: int | str = LOW,
    when: Literal["healthy", "always"] = "healthy",
    window: str | Window | None = None,
    models: Mapping[str, Sequence[str]] | None = None,
    model: str | None = None,
    deadline: float | None = None,
    on_progress: Callable[[BatchProgress], None] | None = None,
    clock: Callable[[], float] = time.time,
    errors: str | os.PathLike[str] | None = None,
) -> BatchSummary:
    """Answer every request of ``requests`` (a JSON Lines file, or its lines) through
    ``client`` and append one result line per answer to ``results``, as each finishes.

    Run it again after a crash or Ctrl-C and it sends only the requests without an answer in
    ``results`` (failed ones are tried again). Answers go at ``priority`` (``"low"`` by
    default: a person's request through the same client, or another process sharing its
    state, takes a free slot first), at most ``concurrency`` at once (default: what the
    routes' limits allow), and with ``when="healthy"`` only while a model each request may
    use is not jammed, halving the pace when answers meet capacity errors. ``window``
    (``"22:00-08:00"``, local time) holds new work outside those hours. ``models`` maps the
    requests' model names to route names (aliases); ``model`` is the model of the lines that
    name none (default: the client picks by weight, so the answering model may differ from
    run to run). Bad lines are reported in the summary with their numbers; the rest run.
    ``clock``: the wall clock (seconds since the epoch) the window is read by.

    Given OpenAI Batch API input lines, ``results`` is what OpenAI writes to a batch's output
    file — the answered requests only — and the failed ones go to ``errors`` (by default
    beside it: ``out.jsonl`` → ``out.errors.jsonl``) in OpenAI's error-file lines, so readers
    written for OpenAI's output read every line of ``results``. A run again drops from
    ``errors`` the requests it tries again: each ``custom_id`` is in one of the two files,
    once. Anthropic Message Batches lines keep every result in ``results``, as Anthropic's
    results do.
    """
    if concurrency is not None and (
        isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
    ):
        raise InvalidRequest(
            f"concurrency must be a positive integer, not {concurrency!r}", reason="invalid"
        )
    if when not in ("healthy", "always"):
        raise InvalidRequest(f"when must be 'healthy' or 'always', not {when!r}", reason="invalid")
    try:
        lane = check_priority(priority)
        hours = Window.parse(window) if isinstance(window, str) else window
    except ValueError as exc:
        raise InvalidRequest(str(exc), reason="invalid") from None
    out = os.fspath(results)
    # Files are read and written off the event loop (other streams share it).
    jobs, bad = parse_jobs(await anyio.to_thread.run_sync(_read_lines, requests))
    before, torn = await anyio.to_thread.run_sync(_previous, out)
    todo = [
        j if j.model or model is None else replace(j, model=model)
        for j in jobs
        if not before.get(j.id, {}).get("ok")
    ]
    failed_to = os.fspath(errors) if errors is not None else _beside(out, ".errors")
    if any(j.shape == "openai" for j in jobs):  # the failures about to be tried again go
        await anyio.to_thread.run_sync(_drop_lines, failed_to, {j.id for j in todo})
    run = _Run(
        pace=Pace(concurrency or _default_concurrency(client)),
        total=len(jobs),
        skipped=len(jobs) - len(todo),
        started=anyio.current_time(),
    )
    try:
        sink = await anyio.open_file(out, "a", encoding="utf-8")
    except OSError as exc:
        raise InvalidRequest(
            f"cannot write the results {out!r}: {exc.strerror or exc}", reason="invalid"
        ) from None
    batch = _Batch(client, run, sink, failed_to, dict(models or {}), lane, deadline, on_progress)
    async with sink, batch:
        if torn:  # the last run died mid-line: that line is not a record, start a new one
            await sink.write("\n")
        batch.progress()
        async with anyio.create_task_group() as tg:
            for job in todo:
                await batch.gate(job, hours, when, clock)
                run.in_flight += 1
                tg.start_soon(batch.answer, job)
                batch.progress()
    return BatchSummary(
        total=run.total,
        answered=run.done,
        failed=run.failed,
        skipped=run.skipped,
        attempts=run.attempts,
        retries=run.retries,
        resumes=run.resumes,
        fallbacks=run.fallbacks,
        input_tokens=run.input_tokens,
        output_tokens=run.output_tokens,
        wall=anyio.current_time() - run.started,
        bad_lines=tuple(bad),
        failures=tuple(_in_line_order(run.failures, bad)),
        errors_file=failed_to if batch.errors is not None else "",
    )


class _Batch:
    """One run's steps: wait for a job's turn, answer it, write its line, tell the progress."""

    def __init__(
        self,
        client: Client,
        run: _Run,
        sink: anyio.AsyncFile[str],
        errors_path: str,
        aliases: dict[str, Sequence[str]],
        lane: int,
        deadline: float | None,
        on_progress: Callable[[BatchProgress], None] | None,
    ) -> None:
        self.client, self.run, self.sink, self.aliases = client, run, sink, aliases
        self.lane, self.deadline, self.on_progress = lane, deadline, on_progress
        #: The error file of an OpenAI batch: its path, and the file once a failure came.
        self.errors_path = errors_path
        self.errors: anyio.AsyncFile[str] | None = None

    async def __aenter__(self) -> _Batch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.errors is not None:
            with anyio.CancelScope(shield=True):
                await self.errors.aclose()

    def progress(self, last: Mapping[str, Any] | None = None) -> None:
        """Tell ``on_progress`` where the batch stands (the counts agree with one another:
        an answer leaves ``in_flight`` as it is counted done or failed)."""
        if self.on_progress is None:
            return
        run = self.run
        self.on_progress(
            BatchProgress(
                total=run.total,
                done=run.done,
                failed=run.failed,
                skipped=run.skipped,
                in_flight=run.in_flight,
                waiting=run.total - run.skipped - run.done - run.failed - run.in_flight,
                tokens=run.tokens,
                elapsed=anyio.current_time() - run.started,
                paused=run.paused,
                last=last,
            )
        )

    async def write(self, job: Job, result: dict[str, Any]) -> None:
        """One write of the whole line, flushed: a crash leaves whole lines, or a torn last
        one that the next run sees as such."""
        line = record(job, result, now=time.time(), token=uuid.uuid4().hex)
        with anyio.CancelScope(shield=True):
            sink = self.sink
            if job.shape == "openai" and not result.get("ok"):  # OpenAI's error file
                if self.errors is None:
                    self.errors = await anyio.open_file(self.errors_path, "a", encoding="utf-8")
                sink = self.errors
            await sink.write(line)
            await sink.flush()
        self.progress({"id": job.id, **result})

    async def answer(self, job: Job) -> None:
        """Answer ``job``, count it, write its line."""
        run, capacity = self.run, [0]
        try:
            result = await self._ask(job, capacity)
        finally:
            run.in_flight -= 1  # counted done or failed in the same step: never both, never -1
            run.pace.answered(capacity[0])
            run.wake()
        await self.write(job, result)

    async def _ask(self, job: Job, capacity: list[int]) -> dict[str, Any]:
        """Stream ``job``'s answer; its result line, the run's counts updated."""
        run = self.run
        try:
            done = await self._stream(job, capacity)
        except InvalidRequest as exc:
            run.failed += 1
            run.failures.append((job.id, job.line, str(exc)))
            return {"ok": False, "error": "InvalidRequest", "message": str(exc)}
        except StreamError as exc:
            run.failed += 1
            run.attempts += exc.attempts
            run.failures.append((job.id, job.line, str(exc)))
            return {
                "ok": False,
                "error": type(exc).__name__,
                "message": str(exc),
                "partial_text": exc.partial_text,
                "attempts": exc.attempts,
                "status_code": exc.status_code,
            }
        usage = done.usage
        run.done += 1
        run.attempts += done.attempts
        run.tokens += usage.output_tokens or 0
        run.input_tokens += usage.input_tokens or 0
        run.output_tokens += usage.output_tokens or 0
        return {
            "ok": True,
            "text": done.text,
            "tool_calls": [
                {"id": c.id, "name": c.name, "arguments": c.arguments} for c in done.tool_calls
            ],
            "finish_reason": done.finish_reason,
            "complete": done.complete,
            "model": done.model,
            "attempts": done.attempts,
            "resumes": done.resumes,
            "usage": {
                "input_tokens": usage.input_tokens,
                "output_tokens": usage.output_tokens,
                "delivered_tokens": usage.delivered_tokens,
            },
        }

    async def _stream(self, job: Job, capacity: list[int]) -> DoneEvent:
        """The done event of ``job``'s stream; retries, resumes and fallbacks counted."""
        run, name = self.run, job.model
        chosen: Any = list(self.aliases[name]) if name in self.aliases else name
        params = dict(job.params)  # a line may set its own lane and deadline
        try:
            stream = self.client.stream(
                job.messages,
                model=chosen,
                priority=params.pop("priority", self.lane),
                deadline=params.pop("deadline", self.deadline),
                **params,
            )
        except TypeError as exc:  # a field that is one of stream()'s own
            raise InvalidRequest(
                f"line {job.line}: {exc}".replace("stream() ", ""), reason="invalid"
            ) from None
        done: DoneEvent | None = None
        async with stream:
            async for ev in stream:
                if ev.type in ("retry", "resume", "fallback"):
                    run.retries += ev.type == "retry"
                    run.resumes += ev.type == "resume"
                    run.fallbacks += ev.type == "fallback"
                    capacity[0] += ev.reason in _CAPACITY
                elif ev.type == "done":
                    done = ev
        assert done is not None
        return done

    async def gate(
        self,
        job: Job,
        hours: Window | None,
        when: Literal["healthy", "always"],
        clock: Callable[[], float],
    ) -> None:
        """Wait until this job may start: a place in the pace, the window, health."""
        run = self.run
        names = _chain(self.client, job, self.aliases)
        while True:
            reason = ""
            if hours is not None:
                local = time.localtime(clock())
                minutes = hours.wait(local.tm_hour * 60 + local.tm_min + local.tm_sec / 60)
                if minutes:
                    reason = f"outside the window (opens in {minutes:.0f} min)"
            jammed, degrading = ("", False)
            if not reason and when == "healthy":
                jammed, degrading = _health_gate(self.client, names)
            # Every model it may use jammed: one answer at a time (the probe that finds out
            # when health returns), never a stream of them into the jam; one of them degrading
            # (the early warning): half the pace, before it jams.
            room = 1 if jammed else run.pace.allowed
            if degrading and not jammed:
                room = max(1, room // 2)
            if not reason and run.in_flight < room:
                if run.paused != jammed:
                    run.paused = jammed
                    self.progress()
                return
            reason = reason or jammed
            if reason != run.paused:
                run.paused = reason
                self.progress()
            waiter = run.changed
            with anyio.move_on_after(_RECHECK if reason else 60.0):
                await waiter.wait()


def _in_line_order(
    failures: list[tuple[str, int, str]], bad: list[BadLine]
) -> list[tuple[str, int, str]]:
    """Every failure in line order: the bad lines (no id) and the failed requests."""
    return sorted([*failures, *(("", b.line, b.message) for b in bad)], key=lambda f: f[1])
