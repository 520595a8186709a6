"""Re-attaching to a response the server kept generating: what the answer knows of it. Pure.

A Responses API response created with ``background: true`` goes on when its stream breaks; the
server replays its events after a sequence number (``responses.replay_request``). While one is
known, the next attempt on its route re-attaches and reads exactly what was missed — no
continuation prompt, no second generation. A failed response, or a re-attach that failed,
forgets it: the answer continues as any other (``policy.reinterpret`` names the failure
``replay_unavailable``, retried at once).
"""

from __future__ import annotations

from dataclasses import dataclass

from streamres._core.classify import Failure
from streamres._providers import responses as _responses
from streamres._providers.wire import StreamDecoder

__all__ = ["Reattach", "Replay"]


@dataclass(frozen=True, slots=True)
class Replay:
    """A response to re-attach to: on route ``index``, id ``response_id``, after ``after``."""

    index: int
    response_id: str
    after: int


class Reattach:
    """The response the answer can re-attach to, if any."""

    __slots__ = ("background", "known")

    def __init__(self, *, background: bool) -> None:
        #: The request asked for a background response itself.
        self.background = background
        self.known: Replay | None = None

    def on(self, index: int) -> Replay | None:
        """The response to re-attach to on route ``index``, if the answer has one there."""
        known = self.known
        return known if known is not None and known.index == index else None

    def attempt_ended(
        self, decoder: StreamDecoder, index: int, fail: Failure | None, *, replayed: bool
    ) -> None:
        """An attempt on route ``index`` ended (``fail``: how, after ``reinterpret``; ``replayed``:
        it was itself a re-attach): keep where its response stands, or forget it."""
        if isinstance(decoder, _responses.ResponsesDecoder):
            response_id = decoder.response_id or (
                self.known.response_id if replayed and self.known else None
            )
            background = decoder.background or self.background
            if decoder.response_failed:
                self.known = None  # a failed response replays its failure: start anew
            elif response_id and background and decoder.sequence is not None:
                self.known = Replay(index, response_id, decoder.sequence)
        if fail is not None and fail.kind == "replay_unavailable":
            self.known = None
