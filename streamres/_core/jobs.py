"""Batch work, the pure part: request lines in, result records out, and when to send. Pure.

Theory of operation. A batch is a JSON Lines file of requests. Each line is one request,
either streamres's own shape::

    {"id": "q1", "messages": [...], "model": "gpt-4o", "max_tokens": 200, "temperature": 0}

(``prompt`` may stand for one user message), or a line of an OpenAI Batch API file::

    {"custom_id": "q1", "method": "POST", "url": "/v1/chat/completions", "body": {...}}

:func:`parse_jobs` turns the lines into :class:`Job`\\ s and the lines it cannot use into
:class:`BadLine`\\ s (with their numbers), so one bad line never stops the rest. Results are
appended one record per finished answer (:func:`record`); :func:`finished` reads a results
file back — the ids answered, the last record of each winning — so a run that was killed, or
stopped with Ctrl-C, and started again sends only what is missing. A torn last line (the
process died while writing it) is not a record: its request runs again.

When to send (``--when``): ``healthy`` sends new work only while a model the job may use is
not jammed (then one answer at a time finds out when it is back), at half the pace while one is
degrading, and the :class:`Pace` halves the batch's concurrency when answers meet capacity
errors (at least one keeps going) and wins one slot back per clean answer — the whole batch
backs off instead of retrying into a jam. ``always`` sends as fast as the limits allow. A
:class:`Window` (``22:00-08:00``) holds new work outside the given hours of the local clock.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["BadLine", "Job", "Pace", "Window", "finished", "parse_jobs", "record"]

#: Body fields that are not request parameters: the job's own, and the streaming switches
#: (every answer is streamed, its usage included).
_OWN = {"messages", "model", "prompt", "stream", "stream_options"}
_OPENAI_BATCH_URLS = {"/v1/chat/completions", "/chat/completions"}


@dataclass(frozen=True)
class Job:
    """One request of a batch: its id, where it came from, what to ask and how."""

    id: str
    line: int
    messages: list[dict[str, Any]]
    model: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    #: The shape its line came in, which its result line is written in: streamres's own, an
    #: OpenAI Batch API input line (then an OpenAI Batch output line), or an Anthropic Message
    #: Batches request (then an Anthropic result line).
    shape: Literal["streamres", "openai", "anthropic"] = "streamres"


@dataclass(frozen=True)
class BadLine:
    """A line that is not a request, and why."""

    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


def _job(obj: Any, n: int) -> Job:
    if not isinstance(obj, dict):
        raise ValueError(f"a request is a JSON object, not {type(obj).__name__}")
    raw_id = obj.get("custom_id", obj.get("id"))
    shape: Literal["streamres", "openai", "anthropic"] = "streamres"
    if "params" in obj and "custom_id" in obj:  # an Anthropic Message Batches request
        body = obj["params"]
        if not isinstance(body, dict):
            raise ValueError("params must be a JSON object (the request's parameters)")
        body = dict(body)
        system = body.pop("system", None)
        if system is not None and isinstance(body.get("messages"), list):
            body["messages"] = [{"role": "system", "content": system}, *body["messages"]]
        shape = "anthropic"
    elif "body" in obj:  # an OpenAI Batch API line
        url = obj.get("url", "/v1/chat/completions")
        if url not in _OPENAI_BATCH_URLS:
            raise ValueError(f"url {url!r}: only chat completions can be streamed")
        body = obj["body"]
        if not isinstance(body, dict):
            raise ValueError("body must be a JSON object (the request's body)")
        if "custom_id" not in obj:
            # OpenAI refuses an output file whose lines carry ids the input did not give.
            raise ValueError(
                "an OpenAI batch line needs its custom_id: the output file names each answer by it"
            )
        shape = "openai"
    else:
        body = {k: v for k, v in obj.items() if k not in ("id", "custom_id")}
    if raw_id is None:
        raw_id = f"line-{n}"
    if isinstance(raw_id, bool) or not isinstance(raw_id, (str, int)) or raw_id == "":
        raise ValueError(f"id must be a non-empty string or an integer, not {raw_id!r:.40}")
    messages = body.get("messages")
    if messages is None and isinstance(body.get("prompt"), str):
        messages = [{"role": "user", "content": body["prompt"]}]
    if not isinstance(messages, list) or not messages:
        raise ValueError('needs "messages" (a non-empty list) or "prompt" (a string)')
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ValueError(f"model must be a string, not {model!r:.40}")
    params = {k: v for k, v in body.items() if k not in _OWN}
    return Job(str(raw_id), n, messages, model, params, shape)


def parse_jobs(lines: Iterable[str]) -> tuple[list[Job], list[BadLine]]:
    """The requests of a JSON Lines batch, and the lines that are not (blank lines skip)."""
    jobs: list[Job] = []
    bad: list[BadLine] = []
    seen: dict[str, int] = {}
    for n, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            job = _job(json.loads(text), n)
        except ValueError as exc:  # json.JSONDecodeError included
            message = str(exc) if not isinstance(exc, json.JSONDecodeError) else f"not JSON ({exc})"
            bad.append(BadLine(n, message))
            continue
        if job.id in seen:
            bad.append(BadLine(n, f"id {job.id!r} is already used on line {seen[job.id]}"))
            continue
        seen[job.id] = n
        jobs.append(job)
    return jobs, bad


def record(job: Job, result: Mapping[str, Any], *, now: float = 0.0, token: str = "") -> str:
    """One result line, in the shape the job's line came in: streamres's own (the job's id,
    then what came of it, ``ok`` first), an OpenAI Batch API output line (``now``: the
    answer's Unix time; ``token``: a unique hex string for its ids), or an Anthropic Message
    Batches result line."""
    if job.shape == "openai":
        line = _openai_line(job, result, now, token)
    elif job.shape == "anthropic":
        line = _anthropic_line(job, result, token)
    else:
        line = {"id": job.id, **result}
    return json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n"


#: The OpenAI Batch API's error codes for a request that got no answer, by streamres error.
_BATCH_CODES = {
    "DeadlineExceeded": "batch_expired",
    "AttemptsExhausted": "server_error",
    "UpstreamUnreachable": "server_error",
}


def _openai_line(job: Job, result: Mapping[str, Any], now: float, token: str) -> dict[str, Any]:
    """An OpenAI Batch API output line: ``response`` with the HTTP status and the whole
    ``chat.completion`` body, or for a refused request its status and error body; a request
    that got no answer has ``response: null`` and ``error: {code, message}`` (``batch_expired``
    when its time ran out)."""
    head = {"id": f"batch_req_{token}", "custom_id": job.id}
    if result.get("ok"):
        usage = result.get("usage") or {}
        prompt, completion = usage.get("input_tokens") or 0, usage.get("output_tokens") or 0
        message: dict[str, Any] = {"role": "assistant", "content": result.get("text") or None}
        calls = result.get("tool_calls") or []
        if calls:
            message["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                }
                for c in calls
            ]
        finish = result.get("finish_reason") or "stop"
        body = {
            "id": f"chatcmpl-{token}",
            "object": "chat.completion",
            "created": int(now),
            "model": result.get("model") or job.model or "",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": "stop" if finish == "refusal" else finish,
                }
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            },
        }
        response = {"status_code": 200, "request_id": f"req_{token}", "body": body}
        return {**head, "response": response, "error": None}
    message_text = str(result.get("message", ""))
    status = result.get("status_code")
    if result.get("error") in ("InvalidRequest", "RequestRejected"):
        error = {
            "message": message_text,
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }
        response = {
            "status_code": status if isinstance(status, int) and status >= 400 else 400,
            "request_id": f"req_{token}",
            "body": {"error": error},
        }
        return {**head, "response": response, "error": None}
    code = _BATCH_CODES.get(str(result.get("error")), "server_error")
    return {**head, "response": None, "error": {"code": code, "message": message_text}}


#: Anthropic's stop reasons, by streamres's finish reason.
_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _anthropic_line(job: Job, result: Mapping[str, Any], token: str) -> dict[str, Any]:
    """An Anthropic Message Batches result line: ``succeeded`` with the whole message,
    ``errored`` with the API's error response, or ``expired`` when its time ran out."""
    if result.get("ok"):
        usage = result.get("usage") or {}
        content: list[dict[str, Any]] = []
        if result.get("text"):
            content.append({"type": "text", "text": result["text"]})
        for c in result.get("tool_calls") or []:
            try:
                given = json.loads(c["arguments"]) if c["arguments"].strip() else {}
            except ValueError:
                given = c["arguments"]  # as the model wrote it
            content.append({"type": "tool_use", "id": c["id"], "name": c["name"], "input": given})
        finish = str(result.get("finish_reason") or "stop")
        message = {
            "id": f"msg_{token}",
            "type": "message",
            "role": "assistant",
            "model": result.get("model") or job.model or "",
            "content": content,
            "stop_reason": _STOP.get(finish, finish),
            "stop_sequence": None,
            "usage": {
                "input_tokens": usage.get("input_tokens") or 0,
                "output_tokens": usage.get("output_tokens") or 0,
            },
        }
        return {"custom_id": job.id, "result": {"type": "succeeded", "message": message}}
    if result.get("error") == "DeadlineExceeded":
        return {"custom_id": job.id, "result": {"type": "expired"}}
    refused = result.get("error") in ("InvalidRequest", "RequestRejected")
    error = {
        "type": "invalid_request_error" if refused else "api_error",
        "message": str(result.get("message", "")),
    }
    errored = {"type": "errored", "error": {"type": "error", "error": error}}
    return {"custom_id": job.id, "result": errored}


def finished(lines: Iterable[str]) -> tuple[dict[str, dict[str, Any]], int]:
    """The records of a results file by id (the last of an id wins), and how many lines were
    not records (a torn last line)."""
    records: dict[str, dict[str, Any]] = {}
    torn = 0
    for text in lines:
        if not text.strip():
            continue
        try:
            rec = json.loads(text)
        except ValueError:
            torn += 1
            continue
        if isinstance(rec, dict) and isinstance(rec.get("custom_id"), str) and "result" in rec:
            # An Anthropic result line: answered when it succeeded.
            outcome = rec.get("result")
            ok = isinstance(outcome, dict) and outcome.get("type") == "succeeded"
            records[rec["custom_id"]] = {**rec, "ok": ok}
        elif isinstance(rec, dict) and isinstance(rec.get("custom_id"), str):
            # An OpenAI Batch output line: answered when it has a 200 response.
            response = rec.get("response")
            ok = isinstance(response, dict) and response.get("status_code") == 200
            records[rec["custom_id"]] = {**rec, "ok": ok}
        elif isinstance(rec, dict) and isinstance(rec.get("id"), str):
            records[rec["id"]] = rec
        else:
            torn += 1
    return records, torn


_WINDOW = re.compile(r"^\s*(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s*$")


@dataclass(frozen=True)
class Window:
    """Hours of the local clock when new work may start: ``start`` to ``end`` in minutes of
    the day; ``end`` before ``start`` crosses midnight (``22:00-08:00``)."""

    start: int
    end: int

    @classmethod
    def parse(cls, text: str) -> Window:
        m = _WINDOW.match(text)
        if m is None:
            raise ValueError(f"a window is HH:MM-HH:MM (such as 22:00-08:00), not {text!r}")
        h1, m1, h2, m2 = (int(g) for g in m.groups())
        if h1 > 23 or h2 > 24 or m1 > 59 or m2 > 59 or (h2 == 24 and m2):
            raise ValueError(f"{text!r}: hours go 00-23 (24:00 ends a day), minutes 00-59")
        start, end = h1 * 60 + m1, h2 * 60 + m2
        if start == end % 1440:
            raise ValueError(f"{text!r} is empty: start and end are the same time")
        return cls(start, end)

    def wait(self, minute: float) -> float:
        """Minutes from ``minute`` of the day until the window is open (0: open now)."""
        start, end = self.start, self.end
        inside = start <= minute < end if start < end else (minute >= start or minute < end)
        if inside:
            return 0.0
        return (start - minute) % 1440


class Pace:
    """How many of the batch's answers may be in flight: halved when answers meet capacity
    errors (never below one), one more per clean answer, up to ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.allowed = limit

    def answered(self, capacity_errors: int) -> None:
        if capacity_errors:
            self.allowed = max(1, self.allowed // 2)
        else:
            self.allowed = min(self.limit, self.allowed + 1)
