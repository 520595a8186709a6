"""New connections opened at the pace each server accepts them (``_core/pace``). I/O shell.

httpcore announces a connect before it starts it (its trace hook ``connect_tcp.started``, which
it awaits, before the connect timer runs) and says how it ended; a stream waits there for room
in its server's window, first come first served, and gives the room back when the connect
ends. A stream on a kept-alive connection never passes here.
"""

from __future__ import annotations

from collections import deque

import anyio
import anyio.lowlevel

from streamres._core.pace import ConnectPace, Outcome

__all__ = ["Connects", "Turn"]


class Turn:
    """One connect's room in its server's window: given back once, by :meth:`Connects.end`."""

    __slots__ = ("at", "pace", "ready", "round")

    def __init__(self, pace: ConnectPace) -> None:
        self.pace = pace
        self.round = 0
        self.at = 0.0
        self.ready = anyio.Event()

    def begin(self) -> None:
        self.round = self.pace.start()
        self.ready.set()


class Connects:
    """The connect windows of a ``Client``'s servers, and the streams waiting for room."""

    def __init__(self) -> None:
        self.paces: dict[str, ConnectPace] = {}
        self._waiting: dict[str, deque[Turn]] = {}

    async def start(self, server: str) -> Turn:
        """Wait for room to open a connection to ``server`` (``scheme://host:port``)."""
        pace = self.paces.get(server)
        if pace is None:
            pace = self.paces[server] = ConnectPace()
        line = self._waiting.setdefault(server, deque())
        turn = Turn(pace)
        await anyio.lowlevel.checkpoint_if_cancelled()
        if pace.room() and not line:
            turn.begin()
            await anyio.lowlevel.cancel_shielded_checkpoint()
        else:
            pace.waited += 1
            line.append(turn)
            try:
                await turn.ready.wait()
            except BaseException:
                if turn.ready.is_set():  # given room as it was cancelled: hand it on
                    self.end(server, turn, "unknown")
                else:
                    line.remove(turn)
                raise
        turn.at = anyio.current_time()
        return turn

    def end(self, server: str, turn: Turn, outcome: Outcome) -> None:
        """The connect of ``turn`` ended so."""
        turn.pace.end(turn.round, outcome, anyio.current_time() - turn.at)
        line = self._waiting.get(server)
        while line and turn.pace.room():  # room for the first waiters, in their order
            line.popleft().begin()
