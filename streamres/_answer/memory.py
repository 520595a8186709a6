"""What the answer's machine is given beyond its options: the client's concurrency limits,
what the process remembers of servers, and the token encodings already loaded. Pure."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from streamres._core.tokens import Counter
from streamres._fleet.routes import Route

__all__ = ["Encodings", "Memory", "Slots"]


class Slots(Protocol):
    """Concurrency limits shared by a client's streams (acquiring is the shell's ``Acquire``)."""

    def release(self, route: Route) -> None: ...

    def notify(self) -> None: ...


@dataclass
class Memory:
    """What a process remembers about servers across answers."""

    #: (base_url, model) pairs whose server refused an assistant prefill: instruct from now on.
    prefill_refused: set[tuple[str, str]] = dataclasses.field(default_factory=set)
    #: Base URLs that have answered (any HTTP response): they get the patient policy.
    reached: set[str | None] = dataclasses.field(default_factory=set)
    #: Base URLs whose server showed it continues a final assistant message (``server:
    #: llama.cpp``): ``auto`` resumes them by prefill.
    continues: set[str | None] = dataclasses.field(default_factory=set)
    #: (base_url, model) pairs whose instruct continuation wrote none of a held-back last
    #: token (a model that does not continue the text it is shown): sent whole from now on.
    no_hold: set[tuple[str | None, str]] = dataclasses.field(default_factory=set)


#: The token encoding of a model if already loaded (never loads): ``(name, counter)``.
Encodings = Callable[[str], "tuple[str, Counter] | None"]
