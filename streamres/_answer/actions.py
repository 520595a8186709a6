"""What the answer's machine asks its shell to do, one action per step. Pure.

Every fact the shell reports returns one of these; :data:`Action` is their union. The shell
performs it and reports the fact it leads to (``states.TABLE`` says where each fact takes the
answer).
"""

from __future__ import annotations

from dataclasses import dataclass

from streamres._core.errors import StreamError
from streamres._core.tokens import TokenLedger
from streamres._fleet.routes import Route
from streamres._providers.wire import HttpRequest

__all__ = [
    "READ",
    "Acquire",
    "Action",
    "Count",
    "Fail",
    "Finish",
    "Load",
    "Read",
    "ReadBody",
    "Reserve",
    "Send",
    "Wait",
]


@dataclass(frozen=True, slots=True)
class Wait:
    """Sleep until ``until``; with ``probing``, wake early when a model's state changes."""

    until: float
    probing: bool = False


@dataclass(frozen=True, slots=True)
class Acquire:
    """Wait (until ``until`` at most) for a concurrency slot on ``route``; report ``acquired``."""

    route: Route
    until: float
    #: The answer's lane (``_core/lanes``): higher priorities get a free slot first.
    priority: int = 0


@dataclass(frozen=True, slots=True)
class Reserve:
    """Take a ticket from the retry budget shared between processes; report ``reserved``."""


@dataclass(frozen=True, slots=True)
class Load:
    """Load the token encoding for ``model`` off the event loop; report ``loaded``."""

    model: str


@dataclass(frozen=True, slots=True)
class Count:
    """Count the text ``ledger`` holds off the event loop (``ledger.settle()`` in a worker
    thread); report ``counted``. Asked for a long answer only (``tokens.ON_LOOP``)."""

    ledger: TokenLedger


@dataclass(frozen=True, slots=True)
class Send:
    """Send ``request``; wait for its headers until ``until``, ``stall`` seconds once sent."""

    request: HttpRequest
    connect_timeout: float
    stall: float
    until: float
    #: This attempt is a half-open model's one probe: with shared state, the shell claims
    #: the probe for every process first (``probe_taken`` if another process has it).
    probe_route: Route | None = None


@dataclass(frozen=True, slots=True)
class ReadBody:
    """Read the start of a body that is not an event stream, until ``until``; report ``body``."""

    until: float


class Read:
    """Read the next bytes of the body before :attr:`Answer.read_deadline` (one instance,
    :data:`READ`: the per-token path allocates nothing)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "READ"


READ = Read()


@dataclass(frozen=True, slots=True)
class Finish:
    """The answer is complete. ``drain``: read the rest of the body (bounded) so the
    connection can be reused, after the done event is out."""

    drain: bool
    until: float


@dataclass(frozen=True, slots=True)
class Fail:
    """Raise ``error``: the answer gives up."""

    error: StreamError


Action = Wait | Acquire | Reserve | Load | Count | Send | ReadBody | Read | Finish | Fail
