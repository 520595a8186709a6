"""Re-attaching to a response the server kept generating: what the answer knows of it. Pure.

Two kinds of server go on generating when a stream breaks, and replay what was missed:

- A Responses API response created with ``background: true``: its events after a sequence
  number (``responses.replay_request``).
- llama.cpp's server, for a chat completion sent with ``X-Conversation-Id`` (every Chat
  Completions attempt carries one): the body again from a byte offset (``llama``). The
  replayed bytes go on through the broken attempt's own SSE and stream decoders, so an event
  cut in half, or a tool call whose arguments had begun, is completed where it broke.

While one is known, the next attempt on its route re-attaches and reads exactly what was missed
— no continuation prompt, no second generation, and at once (the break was the connection's,
not the model's: ``policy`` rule 2b). A failed response, a re-attach that failed, or a second
stall in a row forgets it: the answer continues as any other (``policy.reinterpret`` names the
failure ``replay_unavailable``, retried at once).

A llama.cpp generation nobody will read again is stopped (``DELETE``): the server would
otherwise run it to its end, since its client's going away no longer stops it. Those are the
sessions of an attempt that broke and is not re-attached to, of a known replay the answer moved
away from (another model), and, when the answer is abandoned, of its attempt still reading.
"""

from __future__ import annotations

from dataclasses import dataclass

from streamres._answer.attempt import Exchange
from streamres._core.classify import Failure
from streamres._core.sse import SSEDecoder
from streamres._providers import responses as _responses
from streamres._providers.wire import StreamDecoder

__all__ = ["Reattach", "Replay", "Session"]

#: Failures of a llama.cpp stream after which it is read again: the connection broke, or went
#: silent (the server may be generating still; a second silence in a row is the model's).
_BREAKS = ("connection", "stall")


@dataclass(frozen=True, slots=True)
class Session:
    """A llama.cpp generation on route ``index``, under ``conversation``."""

    index: int
    conversation: str


@dataclass(frozen=True, slots=True)
class Replay:
    """A response to re-attach to, on route ``index``: a Responses API response
    (``response_id``, events after ``after``), or a llama.cpp session (``session``, bytes
    from ``after``, read on by the broken attempt's decoders ``sse`` and ``decoder``)."""

    index: int
    response_id: str
    after: int
    session: Session | None = None
    sse: SSEDecoder | None = None
    decoder: StreamDecoder | None = None
    #: The break it follows was a stall.
    stalled: bool = False


class Reattach:
    """The response the answer can re-attach to, if any, and the generations to stop."""

    __slots__ = ("background", "known", "stops")

    def __init__(self, *, background: bool) -> None:
        #: The request asked for a background response itself.
        self.background = background
        self.known: Replay | None = None
        #: llama.cpp generations to stop (the shell sends each a ``DELETE``, once).
        self.stops: list[Session] = []

    def on(self, index: int) -> Replay | None:
        """The response to re-attach to on route ``index``, if the answer has one there."""
        known = self.known
        return known if known is not None and known.index == index else None

    def going_to(self, index: int) -> None:
        """The next attempt is on route ``index``: a llama.cpp session elsewhere is stopped."""
        known = self.known
        if known is not None and known.session is not None and known.index != index:
            self.stops.append(known.session)
            self.known = None

    def attempt_ended(
        self,
        exchange: Exchange,
        index: int,
        fail: Failure | None,
        *,
        replayed: bool,
        keeps_streams: bool,
        eof: bool,
    ) -> None:
        """An attempt on route ``index`` ended (``fail``: how, after ``reinterpret``; ``replayed``:
        it was itself a re-attach; ``keeps_streams``: its server keeps llama.cpp sessions;
        ``eof``: its body ended): keep where its response stands, or forget it."""
        decoder = exchange.decoder
        if isinstance(decoder, _responses.ResponsesDecoder):
            response_id = decoder.response_id or (
                self.known.response_id if replayed and self.known else None
            )
            background = decoder.background or self.background
            if decoder.response_failed:
                self.known = None  # a failed response replays its failure: start anew
            elif response_id and background and decoder.sequence is not None:
                self.known = Replay(index, response_id, decoder.sequence)
        elif exchange.conversation and keeps_streams:
            self._llama(exchange, index, fail, replayed=replayed, eof=eof)
        if fail is not None and fail.kind == "replay_unavailable":
            self.known = None

    def _llama(
        self, exchange: Exchange, index: int, fail: Failure | None, *, replayed: bool, eof: bool
    ) -> None:
        session = Session(index, exchange.conversation)
        again = self.known if replayed else None
        self.known = None
        if fail is None or fail.connect:
            return  # whole: the session ends by itself; never connected: there is none
        stalled = fail.kind == "stall"
        readable = (
            fail.kind in _BREAKS
            and exchange.status == 200  # the stream had begun
            and not eof  # the decoders closed the body: its last event is gone
            and exchange.inflater.identity  # byte offsets are the server's
            and not (stalled and again is not None and again.stalled)
        )
        if readable:
            self.known = Replay(
                index,
                session.conversation,
                exchange.received,
                session,
                exchange.sse,
                exchange.decoder,
                stalled=stalled,
            )
        elif fail.kind != "replay_unavailable":  # a session that was not found needs no stop
            self.stops.append(session)

    def abandoned(self, exchange: Exchange | None, index: int, *, keeps_streams: bool) -> None:
        """The answer ends here, ``exchange`` (on route ``index``) still reading, if any: the
        generations nobody will read are stopped."""
        if self.known is not None and self.known.session is not None:
            self.stops.append(self.known.session)
            self.known = None
        if exchange is not None and exchange.conversation and keeps_streams:
            self.stops.append(Session(index, exchange.conversation))

    def take_stops(self) -> list[Session]:
        stops, self.stops = self.stops, []
        return stops
