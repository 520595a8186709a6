"""Fault plans for the embedded upstream: what goes wrong, on which request, after how much.

A plan is a queue: each request takes the next fault (``ok`` once the queue is empty), or a
seeded random draw for a sustained storm. Faults are written compactly, comma-separated::

    429:retry-after=2        connect-time status, with Retry-After in seconds
    503:retry-after-ms=150   … with retry-after-ms
    529:retry-after-date=1   … with Retry-After as an HTTP date one second ahead
    500:overloaded           500 whose body says "Overloaded" (Anthropic has sent this)
    at-capacity              "Selected model is at capacity. Please try a different model."
    400  401  404            permanent client errors
    error@40                 in-band error event after 40 tokens (overloaded / server_error)
    error-openrouter@40      OpenRouter's error chunk with finish_reason "error"
    reset@30                 connection dropped after 30 tokens (no terminator, unclean close)
    stall@20                 keep-alives only after 20 tokens, no more content
    slow@0                   keep-alives only (``stall_seconds``), then the whole answer: a
                             slow first token (after N tokens: a long pause mid-answer)
    malformed@10             a chunk that is not JSON
    truncate@50              clean end of the body after 50 tokens, no terminal event
    done-no-finish@15        [DONE] / message_stop with no finish reason (llama-cpp-python)
    flood@20                 after 20 tokens, ``data:`` lines that never end their event
    bomb                     200 whose gzip body inflates to 1 GiB of keep-alive comments
    empty                    200 with an empty body that closes cleanly
    ok                       no fault
    429*3                    the same fault three times in a row
"""

from __future__ import annotations

import difflib
import random
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Literal

__all__ = ["PRESETS", "Fault", "FaultPlan", "demo_storm", "parse_faults"]

FaultKind = Literal[
    "status",
    "at-capacity",
    "error",
    "error-openrouter",
    "reset",
    "stall",
    "slow",
    "malformed",
    "truncate",
    "done-no-finish",
    "flood",
    "bomb",
    "empty",
    "ok",
]
_MIDSTREAM = (
    "error",
    "error-openrouter",
    "reset",
    "stall",
    "slow",
    "malformed",
    "truncate",
    "done-no-finish",
    "flood",
)


@dataclass(frozen=True, slots=True)
class Fault:
    kind: FaultKind = "ok"
    #: Tokens streamed before a mid-stream fault.
    after: int = 0
    status: int = 0
    retry_after: float | None = None
    retry_after_ms: float | None = None
    retry_after_date: float | None = None
    error_type: str | None = None
    message: str | None = None

    def __str__(self) -> str:
        if self.kind == "status":
            head = str(self.status)
        else:
            head = self.kind + (f"@{self.after}" if self.kind in _MIDSTREAM else "")
        opts = [
            f"{k}={v:g}"
            for k, v in (
                ("retry-after", self.retry_after),
                ("retry-after-ms", self.retry_after_ms),
                ("retry-after-date", self.retry_after_date),
            )
            if v is not None
        ]
        if self.error_type:
            opts.append(f"type={self.error_type}")
        return head + (":" + ";".join(opts) if opts else "")


def _parse_one(item: str) -> list[Fault]:
    item = item.strip()
    count = 1
    if "*" in item:
        item, _, n = item.rpartition("*")
        if not n.isdigit():
            raise ValueError(f"fault {item!r}: after '*' comes a repeat count, such as 429*3")
        count = int(n)
    head, _, opts = item.partition(":")
    kind, _, after = head.partition("@")
    if after and not after.isdigit():
        raise ValueError(f"fault {item!r}: after '@' comes a token count, such as reset@40")
    fault = Fault()
    if kind.isdigit():
        fault = Fault(kind="status", status=int(kind))
    elif kind in ("at-capacity", "empty", "bomb", "ok", *_MIDSTREAM):
        fault = Fault(kind=kind, after=int(after) if after else 0)  # type: ignore[arg-type]
    else:
        known = [*PRESETS, "at-capacity", "empty", "bomb", "ok", *_MIDSTREAM]
        near = difflib.get_close_matches(kind, known, n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise ValueError(
            f"unknown fault {item!r}{hint}: use a preset ({', '.join(PRESETS)}), a status "
            f"(429), at-capacity, empty, bomb, ok, or one of {', '.join(_MIDSTREAM)} with @TOKENS"
        )
    for opt in filter(None, (o.strip() for o in opts.replace(";", ",").split(","))):
        key, _, value = opt.partition("=")
        if key == "retry-after":
            fault = replace(fault, retry_after=float(value))
        elif key == "retry-after-ms":
            fault = replace(fault, retry_after_ms=float(value))
        elif key == "retry-after-date":
            fault = replace(fault, retry_after_date=float(value))
        elif key == "type":
            fault = replace(fault, error_type=value)
        elif key == "overloaded" and not value:
            fault = replace(fault, message="Overloaded", error_type="api_error")
        else:
            raise ValueError(f"unknown option {opt!r} in fault {item!r}")
    return [fault] * count


def parse_faults(spec: str) -> list[Fault]:
    """``"429:retry-after=1,reset@40"`` -> faults, in order. Options are separated by ``;``."""
    out: list[Fault] = []
    for item in spec.split(","):
        if item.strip():
            out.extend(_parse_one(item))
    return out


PRESETS = {
    "none": "",
    "light": "429:retry-after=0.5,reset@40",
    "storm": "529:retry-after=1,error@30,reset@70,503,stall@110,truncate@150",
}


class FaultPlan:
    """The faults a server (or one model of it) applies, request by request.

    ``FaultPlan("429,reset@40")`` plays those in order, then serves cleanly;
    ``FaultPlan.storm(seed=1, connect=0.5, midstream=0.33)`` draws faults forever.
    """

    def __init__(
        self,
        faults: str | Iterable[Fault | str] = (),
        *,
        connect_rate: float = 0.0,
        midstream_rate: float = 0.0,
        stall_rate: float = 0.0,
        max_after: int = 60,
        seed: int = 0,
    ) -> None:
        items: list[Fault] = []
        if isinstance(faults, str):
            items = parse_faults(faults)
        else:
            for f in faults:
                items.extend(parse_faults(f) if isinstance(f, str) else [f])
        self.queue = deque(items)
        self.connect_rate = connect_rate
        self.midstream_rate = midstream_rate
        self.stall_rate = stall_rate
        self.max_after = max_after
        self.rng = random.Random(seed)

    @classmethod
    def storm(
        cls,
        *,
        seed: int = 0,
        connect: float = 0.5,
        midstream: float = 0.33,
        stall: float = 0.05,
        max_after: int = 60,
    ) -> FaultPlan:
        """A sustained random fault mix (seeded: the same seed gives the same storm)."""
        return cls(
            connect_rate=connect,
            midstream_rate=midstream,
            stall_rate=stall,
            max_after=max_after,
            seed=seed,
        )

    def push(self, faults: str | Iterable[Fault]) -> None:
        """Queue more faults behind those already planned."""
        self.queue.extend(parse_faults(faults) if isinstance(faults, str) else faults)

    def next(self) -> Fault:
        if self.queue:
            return self.queue.popleft()
        r = self.rng.random()
        if r < self.connect_rate:
            status = self.rng.choice((429, 503, 529))
            return Fault(kind="status", status=status, retry_after=self.rng.choice((None, 0.2)))
        r = self.rng.random()
        after = self.rng.randint(1, self.max_after)
        if r < self.stall_rate:
            return Fault(kind="stall", after=after)
        if r < self.stall_rate + self.midstream_rate:
            kinds: tuple[FaultKind, ...] = (
                "error",
                "reset",
                "truncate",
                "done-no-finish",
                "malformed",
            )
            return Fault(kind=self.rng.choice(kinds), after=after)
        return Fault()


def demo_storm(seed: int = 7) -> tuple[FaultPlan, FaultPlan]:
    """The demo's fault storm for its two models (``streamres chat``, ``streamres proxy``): the
    first answer shows a retry, a resume and a fallback; then a sustained, lighter storm."""
    large = FaultPlan(
        "529:retry-after=1,error@40,at-capacity*3",
        connect_rate=0.1,
        midstream_rate=0.25,
        stall_rate=0.03,
        max_after=80,
        seed=seed,
    )
    small = FaultPlan(
        "reset@50",
        connect_rate=0.1,
        midstream_rate=0.2,
        stall_rate=0.02,
        max_after=80,
        seed=seed + 1,
    )
    return large, small
