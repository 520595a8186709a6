"""What the answer's machine is given beyond its options: the client's concurrency limits and
what the process remembers of servers. Pure.

:class:`Memory` is the one place that learns about servers and answers from what it learnt:
each answer's machine tells it what a server did (answered, named itself, refused a prefill,
did not continue what it was shown), and asks it how to resume on a route.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from streamres._core.continuation import Strategy, choose, continues_prefill
from streamres._fleet.routes import Route
from streamres._providers.llama import keeps_streams

__all__ = ["Memory", "Slots"]


class Slots(Protocol):
    """Concurrency limits shared by a client's streams (acquiring is the shell's ``Acquire``)."""

    def release(self, route: Route) -> None: ...

    def notify(self) -> None: ...


@dataclass
class Memory:
    """What a process remembers about servers across answers."""

    #: (base_url, model) pairs whose server refused an assistant prefill: instruct from now on.
    prefill_refused: set[tuple[str | None, str]] = dataclasses.field(default_factory=set)
    #: Base URLs that have answered (any HTTP response): they get the patient policy.
    reached: set[str | None] = dataclasses.field(default_factory=set)
    #: Base URLs whose server showed it continues a final assistant message (``server:
    #: llama.cpp``): ``auto`` resumes them by prefill.
    continues: set[str | None] = dataclasses.field(default_factory=set)
    #: (base_url, model) pairs whose instruct continuation wrote none of a held-back last
    #: token (a model that does not continue the text it is shown): sent whole from now on.
    no_hold: set[tuple[str | None, str]] = dataclasses.field(default_factory=set)
    #: Base URLs that have never answered and could not be reached, with why (the last
    #: connect failure's words): refused at once while their circuit is open.
    unreachable: dict[str | None, str] = dataclasses.field(default_factory=dict)

    # -- what servers did ----------------------------------------------------------------

    def answered(self, route: Route, status: int, headers: Mapping[str, str]) -> None:
        """``route``'s server sent a response head."""
        self.reached.add(route.base_url)
        self.unreachable.pop(route.base_url, None)
        if continues_prefill(headers):
            self.continues.add(route.base_url)
        elif status == 200:
            # Another server answers at this URL now (a restart, a port used again): what the
            # last one did no longer says what this one does.
            self.continues.discard(route.base_url)

    def refused_prefill(self, route: Route) -> None:
        """``route``'s server refused an assistant prefill, or answered one by starting over
        (it ignores the partial turn): instruct from now on."""
        self.prefill_refused.add((route.base_url, route.model))

    def could_not_reach(self, route: Route, why: str) -> None:
        """No connection could be made to ``route``'s server, which has never answered."""
        if route.base_url not in self.reached:
            self.unreachable[route.base_url] = why

    def why_unreachable(self, route: Route) -> str | None:
        """Why ``route``'s server, which has never answered, could not be reached (if so)."""
        return self.unreachable.get(route.base_url)

    def did_not_continue(self, route: Route) -> None:
        """``route``'s model wrote none of a held-back last token: sent whole from now on."""
        self.no_hold.add((route.base_url, route.model))

    # -- what follows from it ------------------------------------------------------------

    def has_reached(self, route: Route) -> bool:
        return route.base_url in self.reached

    def continues_at(self, route: Route) -> bool:
        """``route``'s server named itself as continuing a final assistant message."""
        return route.base_url in self.continues

    def keeps_streams(self, route: Route, headers: Mapping[str, str]) -> bool:
        """Does ``route``'s server keep llama.cpp stream sessions — as a response's ``headers``
        say, or (no response yet) as its server said before (``server: llama.cpp``, the
        evidence ``continues`` is learnt from)?"""
        return keeps_streams(headers) or route.base_url in self.continues

    def holds_back(self, route: Route) -> bool:
        """An instruct continuation on ``route`` may leave the last token out."""
        return (route.base_url, route.model) not in self.no_hold

    def strategy(self, route: Route, extra_body: dict[str, Any]) -> Strategy:
        """How a continuation on ``route`` is asked for, from what the process remembers."""
        assert route.base_url is not None
        if (route.base_url, route.model) in self.prefill_refused:
            return "instruct"
        return choose(
            route.provider,
            route.base_url,
            route.continuation,
            extra_body,
            server_continues=self.continues_at(route),
        )
