"""The answer's states and what may follow what: one table. Pure.

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

Between two facts the machine runs *steps*, synchronously, until one returns an action; the
state it is left in says which facts it accepts next and which step each one runs
(:data:`TABLE`). One attempt goes through these steps::

    choose ──► turn ──► slot ──► request ──► send ──┬─► read ──► over ──► account ──┬─► done
      ▲   (breaker)  (cool-down,  (limits)          └─► body ──►  ▲                   │
      │               budget)                                      │ (failure)        │
      └──────────────────────────── decide: retry, resume, switch ◄─┘     give up ◄───┘

``choose`` asks each model's breaker (the current model first) and waits, when none will take
a request, for the earliest that will (BUSY); ``turn`` waits out a shared cool-down and takes a
ticket from the retry budget (TURN, RESERVING); ``slot`` takes a concurrency slot (SLOT);
``request`` builds the request, a continuation once text was delivered (``request``); ``over``
records the outcome with the fleet (breaker, weight, metrics); ``account`` counts tokens; a
failure goes to the policy (:func:`~streamres._core.policy.decide`), the single pure function
that says what happens after any failure, and a delay it asks for is waited out (BACKOFF).
Every step that needs a token count first makes sure the encoding is loaded: it returns
``Load`` (or, for a long answer, ``Count``) and stays in its own state (CHOOSING, REQUEST,
ACCOUNT, CLOSING), so the ``loaded`` or ``counted`` fact runs the same step again.

Whatever way the shell leaves (an error, the caller closing the stream), it calls
``Answer.abandon``, which gives back what the attempt in progress holds; ``abandon``,
``crashed`` and ``unbuildable`` are not facts and are taken in any state.
"""

from __future__ import annotations

import enum
from typing import Literal

__all__ = ["TABLE", "Fact", "ProtocolError", "State", "Step", "step_for"]


class State(enum.Enum):
    """Where the answer waits for the shell: the action it returned last, and the step it
    resumes with."""

    IDLE = "idle"  # made, not started
    CHOOSING = "choosing"  # a fallback event needs the delivered tokens counted first
    BUSY = "busy"  # no model will take a request: waiting for the earliest that will
    TURN = "turn"  # waiting out a cool-down or the retry budget's turn
    RESERVING = "reserving"  # asking the retry budget shared between processes
    SLOT = "slot"  # waiting for a concurrency slot
    REQUEST = "request"  # a continuation needs the tokens counted or an encoding loaded
    SENDING = "sending"  # waiting for the response's headers
    BODY = "body"  # reading the start of a body that is not an event stream
    READING = "reading"  # reading the event stream
    ACCOUNT = "account"  # the attempt's tokens need counting
    BACKOFF = "backoff"  # waiting out the delay the policy asked for
    CLOSING = "closing"  # the done event needs the answer's tokens counted
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

#: A step of the machine, run when a fact comes: a fact handled by its own method, or one of
#: the steps a wait resumes (``Answer._RESUME``).
Step = Fact | Literal["choose", "woke_from_busy", "ticket", "slot", "request", "account", "done"]

#: State × fact → the step that runs. A fact missing from its state's row is a bug in the
#: shell (``ProtocolError``); DONE and FAILED take none.
TABLE: dict[State, dict[Fact, Step]] = {
    State.IDLE: {"start": "choose"},
    State.CHOOSING: {"loaded": "choose", "counted": "choose"},
    State.BUSY: {"woke": "woke_from_busy"},
    State.TURN: {"woke": "slot"},
    State.RESERVING: {"reserved": "ticket"},
    State.SLOT: {"acquired": "acquired"},
    State.REQUEST: {"loaded": "request", "counted": "request"},
    State.SENDING: {
        "started": "started",
        "send_failed": "send_failed",
        "probe_taken": "probe_taken",
    },
    State.BODY: {"body": "body"},
    State.READING: {
        "data": "data",
        "eof": "eof",
        "timed_out": "timed_out",
        "read_failed": "read_failed",
    },
    State.ACCOUNT: {"loaded": "account", "counted": "account"},
    State.BACKOFF: {"woke": "choose"},
    State.CLOSING: {"loaded": "done", "counted": "done"},
    State.DONE: {},
    State.FAILED: {},
}


class ProtocolError(AssertionError):
    """The shell reported a fact the answer's state does not take: a bug in the shell."""


def step_for(state: State, fact: Fact) -> Step:
    """The step ``fact`` runs in ``state``; :class:`ProtocolError` if it may not come now."""
    step = TABLE[state].get(fact)
    if step is None:
        raise ProtocolError(f"{fact!r} cannot come while the answer is {state.value}")
    return step
