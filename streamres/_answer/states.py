"""The answer's states and what follows what: one table, whose value is the next state. Pure.

Theory of operation
-------------------
An answer is a series of attempts, each a request to one model, until one finishes or the
answer gives up. The machine (:class:`~streamres._answer.machine.Answer`) performs nothing: in
the manner of h11's ``Connection``, the shell feeds it *facts* — "the response started (status,
headers)", "these bytes came", "the body ended", "the read timer fired", "the wait is over" —
each as a method call with the time, and every call returns the next *action* for the shell
(``actions``):

    Wait(until, probing)   sleep until ``until`` (or until a half-open probe's outcome): woke
    Acquire(route, until)  take a concurrency slot on a route and its account: acquired
    Reserve()              take a ticket from a retry budget shared between processes: reserved
    Load(model)            load the token encoding for ``model`` (off the event loop): loaded
    Count(ledger)          count a long answer's tokens (off the event loop): counted
    Send(request, ...)     open the HTTP stream: started, send_failed or probe_taken
    ReadBody(until)        read the start of a body that is not an event stream: body
    READ                   read the next bytes before ``read_deadline``: data, eof,
                           timed_out or read_failed
    Finish(drain)          the answer is complete (``drain``: read the body's end for reuse)
    Fail(error)            raise ``error`` (a :class:`~streamres.StreamError`)

States are of two kinds. In a *waiting* state the answer has returned an action and waits for
the shell's fact. In a *step* state the machine runs that state's step at once: the step
decides, and names what it concluded — an *outcome* ("chosen", "busy", "give_up", …). Facts
and outcomes are both *events*, and :data:`TABLE` maps state × event to the next state; one
method (``Answer._go``) looks it up and sets it, and is the only place the state changes. The
table says *where* the answer goes; the step says *which* of its ways it takes, from the data
(a breaker's state, the policy's decision, whether a count is needed). A fact missing from its
state's row is a bug in the shell (:class:`ProtocolError`).

One attempt goes through these states::

    CHOOSE ─► QUEUE ─► TICKET ─► CLAIM ─► REQUEST ─► SENDING ─► HEADERS ─┬─► READING ─┐
      ▲  (breaker) (budget) (cool-down) (limits)                        └─► BODY ─────┤
      │                                                                               ▼
      └──────────────── DECIDE: retry, resume, switch ◄── ACCOUNT ◄────────────── OVER
                           │ (give up)                   │ (finished)
                           ▼                             ▼
                         FAILED                        CLOSE ─► DONE

``CHOOSE`` asks each model's breaker (the current model first) and waits, when none will take
a request, for the earliest that will (BUSY, then RECHOOSE); ``QUEUE`` takes a ticket from the
retry budget (asking the shell when the budget is shared: RESERVING); ``TICKET`` waits out a
shared cool-down and the ticket's turn (TURN); ``CLAIM`` takes a concurrency slot (SLOT);
``REQUEST`` builds the request, a continuation once text was delivered; ``OVER`` records the
outcome with the fleet (breaker, weight, metrics); ``ACCOUNT`` counts tokens and judges the
seam; a failure goes to ``DECIDE``, which asks the policy
(:func:`~streamres._core.policy.decide`, the single pure function that says what happens after
any failure), and a delay it asks for is waited out (BACKOFF). A step that needs a token count
first makes sure the encoding is loaded: it concludes ``load`` (the action is ``Load``, or
``Count`` for a long answer), waits in its own loading state, and ``loaded`` or ``counted``
runs the step again. (REQUEST loads only the encoding of an instruct continuation's model:
CHOOSE, which every attempt passes, has counted the delivered text.)

What the table cannot say, written as code: which of a step's outcomes comes (the step's
data); that ``abandon`` (the shell leaving, whichever way), ``crashed`` and ``unbuildable`` are
taken in any state and change none; and that ``data`` in READING — the per-token path — checks
its state with one comparison instead of a lookup (the entry is READING → READING).
"""

from __future__ import annotations

import enum
from typing import Literal, get_args

__all__ = [
    "FACTS",
    "TABLE",
    "Event",
    "Fact",
    "Outcome",
    "ProtocolError",
    "State",
    "next_state",
    "table_markdown",
]


class State(enum.Enum):
    """Where the answer is: waiting for the shell's fact, or about to run a step."""

    IDLE = "idle"  # made, not started
    CHOOSE = "choose"  # step: which model takes the next attempt
    LOAD_CHOOSE = "load_choose"  # a fallback event needs the delivered tokens counted first
    BUSY = "busy"  # no model will take a request: waiting for the earliest that will
    RECHOOSE = "rechoose"  # step: the wait for a model ended (the deadline, then CHOOSE)
    QUEUE = "queue"  # step: a ticket from the retry budget
    RESERVING = "reserving"  # asking the retry budget shared between processes
    TICKET = "ticket"  # step: a cool-down or the ticket's turn to wait out
    TURN = "turn"  # waiting out a cool-down or the retry budget's turn
    CLAIM = "claim"  # step: a concurrency slot, where the client has limits
    SLOT = "slot"  # waiting for a concurrency slot
    REQUEST = "request"  # step: build the request (a continuation once text was delivered)
    LOAD_REQUEST = "load_request"  # an instruct continuation needs its model's encoding
    SENDING = "sending"  # waiting for the response's headers
    HEADERS = "headers"  # step: the response's head says an event stream, or not
    BODY = "body"  # reading the start of a body that is not an event stream
    READING = "reading"  # reading the event stream
    OVER = "over"  # step: the attempt ended; its outcome goes to the fleet
    ACCOUNT = "account"  # step: the attempt's tokens counted, the seam judged
    LOAD_ACCOUNT = "load_account"  # the attempt's tokens need counting
    DECIDE = "decide"  # step: after a failure, the policy's decision
    BACKOFF = "backoff"  # waiting out the delay the policy asked for
    CLOSE = "close"  # step: the done event
    LOAD_CLOSE = "load_close"  # the done event needs the answer's tokens counted
    DONE = "done"  # Finish returned
    FAILED = "failed"  # Fail returned


#: What the shell reports: one method of ``Answer`` each.
Fact = Literal[
    "start",
    "woke",
    "loaded",
    "counted",
    "reserved",
    "acquired",
    "started",
    "send_failed",
    "probe_taken",
    "body",
    "data",
    "eof",
    "timed_out",
    "read_failed",
]

#: What a step concluded.
Outcome = Literal[
    "chosen",  # a model will take the attempt
    "busy",  # none will yet
    "go",  # nothing to wait for: on to the next step
    "load",  # an encoding or a count first (Load, Count)
    "reserve",  # the shared retry budget is asked (Reserve)
    "wait",  # a cool-down or the ticket's turn (Wait)
    "acquire",  # a slot is asked for (Acquire)
    "send",  # the request goes out (Send)
    "spent",  # the token budget is spent: the answer ends without another request
    "stream",  # the headers say an event stream: read it (READ)
    "not_a_stream",  # an error or a page: read its start (ReadBody)
    "ended",  # the attempt ended (complete or failed)
    "recorded",  # its outcome is with the fleet
    "finished",  # it finished the answer
    "failed",  # it failed: the policy decides
    "backoff",  # the policy asked for a delay (Wait)
    "finish",  # the done event is out (Finish)
    "give_up",  # the answer fails (Fail)
]

Event = Fact | Outcome

#: Every fact, in the order of ``Fact``.
FACTS: tuple[Fact, ...] = get_args(Fact)

#: State × event → the next state. DONE and FAILED take none.
TABLE: dict[State, dict[Event, State]] = {
    State.IDLE: {"start": State.CHOOSE},
    State.CHOOSE: {
        "chosen": State.QUEUE,
        "busy": State.BUSY,
        "load": State.LOAD_CHOOSE,
        "give_up": State.FAILED,
    },
    State.LOAD_CHOOSE: {"loaded": State.CHOOSE, "counted": State.CHOOSE},
    State.BUSY: {"woke": State.RECHOOSE},
    State.RECHOOSE: {"go": State.CHOOSE, "give_up": State.FAILED},
    State.QUEUE: {"reserve": State.RESERVING, "go": State.TICKET},
    State.RESERVING: {"reserved": State.TICKET},
    State.TICKET: {"wait": State.TURN, "go": State.CLAIM, "give_up": State.FAILED},
    State.TURN: {"woke": State.CLAIM},
    State.CLAIM: {"acquire": State.SLOT, "go": State.REQUEST},
    State.SLOT: {"acquired": State.REQUEST},
    State.REQUEST: {
        "send": State.SENDING,
        "load": State.LOAD_REQUEST,
        "spent": State.CLOSE,
        "give_up": State.FAILED,
    },
    State.LOAD_REQUEST: {"loaded": State.REQUEST},
    State.SENDING: {
        "started": State.HEADERS,
        "send_failed": State.OVER,
        "probe_taken": State.CHOOSE,
    },
    State.HEADERS: {"stream": State.READING, "not_a_stream": State.BODY, "ended": State.OVER},
    State.BODY: {"body": State.OVER},
    State.READING: {
        "data": State.READING,
        "eof": State.READING,
        "timed_out": State.READING,
        "read_failed": State.OVER,
        "ended": State.OVER,
    },
    State.OVER: {"recorded": State.ACCOUNT},
    State.ACCOUNT: {
        "finished": State.CLOSE,
        "failed": State.DECIDE,
        "load": State.LOAD_ACCOUNT,
    },
    State.LOAD_ACCOUNT: {"loaded": State.ACCOUNT, "counted": State.ACCOUNT},
    State.DECIDE: {"go": State.CHOOSE, "backoff": State.BACKOFF, "give_up": State.FAILED},
    State.BACKOFF: {"woke": State.CHOOSE},
    State.CLOSE: {"finish": State.DONE, "load": State.LOAD_CLOSE},
    State.LOAD_CLOSE: {"loaded": State.CLOSE, "counted": State.CLOSE},
    State.DONE: {},
    State.FAILED: {},
}


class ProtocolError(AssertionError):
    """An event came that the answer's state does not take: a fact, a bug in the shell; an
    outcome, a bug in the machine."""


def next_state(state: State, event: Event) -> State:
    """Where ``event`` takes the answer from ``state``; :class:`ProtocolError` if it may not
    come now."""
    new = TABLE[state].get(event)
    if new is None:
        raise ProtocolError(f"{event!r} cannot come while the answer is {state.value}")
    return new


def table_markdown() -> str:
    """The table as the documentation shows it, a row a state (``docs/how-it-works.md``; a
    test compares the two)."""
    rows = ["| state | kind | event → next state |", "|---|---|---|"]
    for state, row in TABLE.items():
        if not row:
            kind = "end"
        elif any(event in FACTS for event in row):
            kind = "waits for the shell"
        else:
            kind = "runs its step"
        moves = ", ".join(f"`{event}` → `{new.name}`" for event, new in row.items())
        rows.append(f"| `{state.name}` | {kind} | {moves or '—'} |")
    return "\n".join(rows)
