"""The token encodings an answer counts with: which are here, which one it waits for. Pure.

Counting the delivered tokens needs the model's encoding, which the shell loads off the event
loop (``Load``, then ``loaded``); a long text is counted off the loop too (``Count``, then
``counted``). A step that needs a count asks :meth:`Encodings.needs` first: ``None`` means go
on, an action means the step waits in its loading state and runs again when it is done.
"""

from __future__ import annotations

from collections.abc import Callable

from streamres._answer.actions import Count, Load
from streamres._answer.delivery import Delivery
from streamres._core.tokens import ON_LOOP, Counter

__all__ = ["Encodings", "Loaded"]

#: The token encoding of a model if already loaded (never loads): ``(name, counter)``.
Loaded = Callable[[str], "tuple[str, Counter] | None"]


class Encodings:
    """The encodings this answer has (loaded for it, or already in the process)."""

    __slots__ = ("_awaiting", "_here", "_mine")

    def __init__(self, here: Loaded) -> None:
        self._here = here
        #: Encodings loaded at this answer's request, by model.
        self._mine: dict[str, tuple[str, Counter]] = {}
        #: The ``Load`` the answer waits for.
        self._awaiting = Load("")

    def get(self, model: str) -> tuple[str, Counter] | None:
        return self._mine.get(model) or self._here(model)

    def ask(self, model: str) -> Load:
        """The answer waits for ``model``'s encoding."""
        self._awaiting = Load(model)
        return self._awaiting

    def arrived(self, encoding: str, count: Counter) -> tuple[str, Counter]:
        """The encoding asked for is here."""
        got = self._mine[self._awaiting.model] = (encoding, count)
        return got

    def needs(self, delivery: Delivery, model: str) -> Load | Count | None:
        """Before a count of the delivered tokens: ``Load`` when the encoding is not here,
        ``Count`` when more text waits to be counted than is counted on the event loop."""
        if delivery.count is None:
            got = self.get(model)
            if got is None:
                return self.ask(model)
            delivery.have_encoding(*got)
        ledger = delivery.ledger_of_text()
        if ledger.pending > ON_LOOP:
            return Count(ledger)
        return None
