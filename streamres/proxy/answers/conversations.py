"""The Responses API's conversation state over HTTP: ``previous_response_id`` and what
``GET``, ``DELETE`` and ``input_items`` of ``/v1/responses/{id}`` find (:mod:`.stored` keeps
the records; an answer that ended a moment ago is found where it is held, :mod:`.held`)."""

from __future__ import annotations

from typing import Any

import anyio

from streamres.proxy.answers.answer import Held
from streamres.proxy.answers.held import Answers
from streamres.proxy.answers.stored import (
    DELETED,
    Away,
    Deleted,
    ResponseStore,
    Stored,
    page,
    stored_of,
)
from streamres.proxy.faces.inbound import Call
from streamres.proxy.faces.refusal import Refused

__all__ = ["Conversations"]

_AWAY = (
    "this response cannot be looked up now: shared state is away (or has just come back, and "
    "the replicas are writing what it lost again), and this replica does not hold it — try again"
)


class Conversations:
    """Stored responses as the Responses API serves them."""

    def __init__(self, store: ResponseStore, answers: Answers) -> None:
        self.store = store
        self.answers = answers

    async def ended(self, held: Held) -> None:
        """An answer ended here: a Responses API answer made with ``store`` is stored."""
        if held.call.api == "responses" and held.call.store and not held.lost:
            await self.store.put(stored_of(held.call, held.snapshot(), held.owner))

    async def kept(self, call: Call, response: dict[str, Any], owner: str | None) -> None:
        """An answer that was not held (not streamed) ended as ``response``."""
        if call.api == "responses" and call.store:
            await self.store.put(stored_of(call, response, owner))

    async def _held(self, response_id: str, owner: str | None) -> Held | None:
        answers = self.answers
        held = answers.find(response_id, owner) or await answers.find_shared(response_id, owner)
        return held if held is not None and held.call.api == "responses" else None

    async def _stored(
        self, response_id: str, owner: str | None, held: Held | None
    ) -> Stored | Deleted | None:
        """The stored record; with Redis away, ``None`` when ``held`` (this process's) can
        answer instead, else a 503. A response deleted (on any replica) is no longer held
        here either."""
        try:
            stored = await self.store.get(response_id, owner)
        except Away:
            if held is None:
                raise Refused(503, _AWAY, 2.0) from None
            return None
        if stored is DELETED:
            gone = self.answers.find(response_id, owner)
            if gone is not None:
                self.answers.drop(gone)
        return stored

    async def _find(self, response_id: str, owner: str | None) -> Stored | None:
        """The stored response, or the record of an ended answer still held (stored a moment
        from now, or held by a replica that went before it stored it)."""
        stored = await self._stored(response_id, owner, self.answers.find(response_id, owner))
        if isinstance(stored, Stored):
            return stored
        if stored is DELETED:
            return None
        held = await self._held(response_id, owner)
        shared = self.answers.shared
        if held is None and shared is not None and await shared.unsure():
            raise Refused(503, _AWAY, 2.0)  # Redis away, or lately back: it may exist
        if held is None or not held.call.store:
            return None
        if not held.log.ended:
            with anyio.move_on_after(2.0):  # a shadow of another replica's, catching up
                while not held.log.ended:
                    await held.log.changed(len(held.log.events))
        if not held.log.ended:
            raise Refused(
                400,
                f"the response {response_id!r} is still in progress: continue from it once it "
                "has ended (or cancel it)",
            )
        stored = stored_of(held.call, held.snapshot(), held.owner)
        await self.store.put(stored)  # kept past the answer's hold from now
        return stored

    async def follow_on(self, call: Call, owner: str | None) -> None:
        """``previous_response_id``: the stored conversation goes before the request's input
        (after its instructions; the previous response's are not carried over)."""
        if call.previous is None:
            return
        stored = await self._find(call.previous, owner)
        if stored is None:
            raise Refused(
                404,
                f"Previous response with id {call.previous!r} not found: it never was, it is "
                "another key's, it was deleted, or it was made with store: false",
                code="previous_response_not_found",
            )
        head = call.head
        call.messages = call.messages[:head] + stored.conversation + call.messages[head:]
        # Its input items: every item the response is made from, the earlier turns' inputs
        # and outputs first (as the API lists them, and as Llama Stack keeps them).
        earlier = [i for i in stored.response.get("output") or () if isinstance(i, dict)]
        call.items = [*stored.input, *earlier, *call.items]

    async def serve(
        self, verb: str, response_id: str, owner: str | None, query: dict[str, str]
    ) -> tuple[int, dict[str, Any]] | None:
        """A stored response asked for (``read``, ``stop``, ``delete``, ``items``): the status
        and body to answer with; ``None``: the held answer serves it (it still runs, or it was
        not stored)."""
        if verb in ("delete", "items"):
            held = await self._held(response_id, owner)
        else:
            held = self.answers.find(response_id, owner)
            if held is not None and not held.log.ended:
                return None  # read or cancelled as it runs
        found = await self._stored(response_id, owner, held)
        if found is DELETED:
            return None  # no longer held either: the 404 of an id that never was
        stored = found if isinstance(found, Stored) else None
        if verb == "delete":
            if stored is None and held is None:
                return None  # the held answers' 404
            if held is not None:
                await self.answers.stop(held)
                self.answers.drop(held)
                if self.answers.shared is not None:
                    await self.answers.shared.forget(response_id)
            try:
                await self.store.delete(response_id, owner)
            except Away:
                raise Refused(503, _AWAY, 2.0) from None
            return 200, {"id": response_id, "object": "response", "deleted": True}
        if verb == "items":
            items = stored.input if stored is not None else held.call.items if held else None
            if items is None:
                return None
            try:
                return 200, page(items, query)
            except ValueError as exc:
                raise Refused(400, str(exc)) from None
        if stored is None or (verb == "read" and query.get("stream") == "true"):
            return None  # the held answer's (its events are read again while they are held)
        return 200, stored.response  # read, or cancelled after its end: as it ended
