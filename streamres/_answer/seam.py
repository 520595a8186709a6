"""The seam: where a resumed attempt's text meets what was delivered, and how that ends. Pure.

An instruct continuation is asked, in words, to go on from the delivered text. Two of its
endings are not the answer's end:

- It finishes normally having added nothing of substance — a restart no longer than what was
  delivered, a bare preamble, an empty turn (*ended at the seam*). Measured on a real instruct
  model, that is mostly a restart that stopped after the sentences it had already given, even
  when the delivered text ends a sentence. It is asked again in the quoting wording and then
  of the next model (:data:`SEAM_TRIES` in all), after which the answer ends as it stands,
  with ``join="ended_at_seam"``. (A prefill continuation that adds nothing is the model saying
  it is done, and is believed.)
- It writes none of the last token the request held back (``dedup.hold_back``: *missed*): the
  model does not continue what it is shown. Nothing of it is joined; it is asked again at once
  with the whole answer so far, and the model is remembered (``Memory.did_not_continue``), so
  its requests are sent whole from then on — one extra request per model and process, at most.

Neither is charged to the model as a failure of its server (``policy.consecutive_failures``).

A continuation may also call tools the conversation already ran (a model that reads "continue"
as a new turn runs the last tool round again): those calls are not handed on
(``Reader``), and every later continuation of the answer is sent with ``tool_choice: "none"``
(``no_tools``) — the tools stay offered, as a history with calls needs, but the model finishes
its text.
"""

from __future__ import annotations

from typing import Literal

from streamres._answer.memory import Memory
from streamres._core.classify import Failure, failure
from streamres._core.dedup import Deduplicator
from streamres._fleet.routes import Route

__all__ = ["SEAM_TRIES", "Seam"]

#: How many times an instruct continuation that ended at the seam, adding nothing, is asked
#: again (in the other wording, or of the next model) before the answer ends as it stands.
SEAM_TRIES = 2


class Seam:
    """The answer's continuations that did not continue: how often, and what comes next."""

    __slots__ = ("no_tools", "tries")

    def __init__(self) -> None:
        #: Continuations asked again because they ended at the seam or missed it.
        self.tries = 0
        #: A continuation ran the conversation's tools again: the next ones may call none.
        self.no_tools = False

    def repeated_calls(self) -> None:
        """A continuation called tools the conversation already ran."""
        self.no_tools = True

    @property
    def wording(self) -> int:
        """Which wording the next instruct continuation is asked in."""
        return self.tries

    def holds_back(self, route: Route, memory: Memory) -> bool:
        """The next instruct request on ``route`` may leave the last token out: the first
        wording, on a model not known to ignore it."""
        return self.tries == 0 and memory.holds_back(route)

    def missed(self, route: Route, memory: Memory) -> Failure:
        """The continuation wrote none of what its request held back: the failure it ends
        with (asked again at once, whole)."""
        memory.did_not_continue(route)
        self.tries += 1
        return failure(
            "ended_at_seam", "the continuation did not pick the answer up where it stopped"
        )

    def judge(
        self,
        dedup: Deduplicator | None,
        finish: str,
        new: str,
    ) -> Literal["continued", "ask_again", "as_it_stands"]:
        """A continuation finished normally (``finish``: why, :meth:`Delivery.finish`), adding
        ``new``: did it continue the answer? If not, it is asked again (the failure is
        :meth:`ended`), or, its tries spent, the answer ends as it stands."""
        if not _ended_at_seam(dedup, finish, new):
            return "continued"
        if self.tries < SEAM_TRIES:
            self.tries += 1
            return "ask_again"
        return "as_it_stands"

    @staticmethod
    def ended() -> Failure:
        return failure(
            "ended_at_seam", "the continuation stopped at the seam without adding to the answer"
        )


def _ended_at_seam(dedup: Deduplicator | None, finish: str, new: str) -> bool:
    """An instruct continuation that finished normally having added nothing of substance (a
    tool call handed on is substance: its finish is ``tool_calls``)."""
    if dedup is None or dedup.mode != "instruct":
        return False
    if finish not in ("stop", "end_turn"):
        return False  # "length": the budget ended it, which the done event says
    return not new.strip()
