"""Answers held for their readers: an answer outlives the connection that asked for it.

Theory of operation. A streamed answer (and every Responses API ``background`` answer) is
produced by a task of the proxy's, not of the request that asked: it reads the library's events,
encodes each in the client's API (:class:`~.outbound.Writer`, whose events carry ``id:``
numbers) and keeps the encoded events, numbered, beside the events themselves
(:class:`streamres.AnswerLog`). A request is a *reader*: it sends what is held after the number
it names (``Last-Event-ID``, the Responses API's ``starting_after``; none: from the start),
then each new event as it is made, to the end of the answer.

    running ──(the last reader goes)──▶ lingering ──(a reader comes within ``hold``)──▶ running
                                            │
                                 (``hold`` passes, nobody read)
                                            ▼
                                 parked: the upstream closed, the partial kept
                                            │
                     (a reader comes back) ─┴─▶ running again, from the partial
                                                (``continue_from``), by the same deadline

An answer ends with its done event, a failure (an error event after the partial, or, before
any text, the HTTP error its first reader gets), or a deliberate stop (``POST
/v1/answers/{id}/stop``, the Responses API's ``cancel``: a person pressing Stop is not a
disconnect). Ended and parked answers are kept ``keep`` seconds for late readers, then
forgotten; a background answer runs without readers to its end. An answer is found by its id
(128 random bits) and only with the client key that started it: any other key is told it does
not exist. What one answer holds is bounded as the answer is (its characters are capped); the
answers held are bounded in number and in bytes, in all and per client key (``max_answers``,
``max_bytes``, ``max_bytes_per_key``: past them, the key's own longest-ended go first, another
key's never before ``keep``), and so are one answer's readers (``max_readers``). An answer
running takes one of its key's slots until it stops running (ends or is parked).

With shared state (``--redis``) each answer is also written to Redis, where any process reads
it and adopts it when its writer is gone (:mod:`.shared` tells how).
"""

from __future__ import annotations

import collections
import contextlib
import json
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import anyio
from anyio.abc import TaskGroup

import streamres
from streamres._shell.apps import log
from streamres.proxy.answers.answer import Full, Held, Ledger, within
from streamres.proxy.answers.shared import (
    FLUSH,
    LEASE_MS,
    SharedAnswers,
    call_from,
    event_json,
)
from streamres.proxy.config import HoldLimits
from streamres.proxy.faces.inbound import Call
from streamres.proxy.faces.outbound import Writer, without_urls

__all__ = ["Answers", "Full", "Held"]


class Answers:
    """The answers this proxy process holds, by id; their producers run in ``tasks``."""

    def __init__(
        self,
        client: streamres.Client,
        limits: HoldLimits,
        *,
        clock: Callable[[], float] = anyio.current_time,
    ) -> None:
        self.client = client
        self.limits = limits
        self.clock = clock
        #: Where producers run: the proxy's own task group (``run``); ``None`` until then, and
        #: an answer is produced inside its first request (it ends with that request).
        self.tasks: TaskGroup | None = None
        self._held: collections.OrderedDict[str, Held] = collections.OrderedDict()
        #: What the held answers weigh (``Held.weight``), counted as they grow.
        self._ledger = Ledger(limit=limits.max_bytes, over=self._grown)
        self._producing = 0
        self._idle: anyio.Event | None = None
        #: The answers' keys in Redis, when the client shares state (``--redis``).
        self.shared: SharedAnswers | None = None
        self._mismatch = False
        #: Answers being looked up in Redis (one lookup each, however many readers ask).
        self._finding: dict[str, anyio.Event] = {}
        #: Called when an answer this process produced (or stopped) has ended: the proxy
        #: stores Responses API responses so (:mod:`.stored`).
        self.on_end: Callable[[Held], Awaitable[None]] | None = None
        #: Called when an answer this process produced in one go has ended, with what the
        #: proxy added to it (milliseconds): the proxy logs it and counts it in its metrics.
        self.on_answered: Callable[[Call, float], None] | None = None
        #: Called after Redis came back, or lost its data, once this process's answers are
        #: written again: the proxy writes its stored responses again too.
        self.on_loss: Callable[[], Awaitable[None]] | None = None

    @contextlib.asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        """Hold answers until the block ends (then every producer is cancelled). An error of
        the block's own comes out as it was raised (not in an exception group): the producers
        catch their own, so it is the only one."""
        state = self.client._shared_state
        if state is not None:
            self.shared = SharedAnswers(state, self.limits.keep)
            await self.shared.started()
        try:
            async with anyio.create_task_group() as tg:
                self.tasks = tg
                tg.start_soon(self._sweep)
                if self.shared is not None:
                    tg.start_soon(self._after_losses)
                try:
                    yield
                finally:
                    self.tasks = None
                    tg.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise

    async def settled(self) -> None:
        """Wait until no answer is being produced."""
        while self._producing:
            if self._idle is None:
                self._idle = anyio.Event()
            await self._idle.wait()

    def __len__(self) -> int:
        return len(self._held)

    @property
    def held_bytes(self) -> int:
        return self._ledger.total

    # -- finding and starting -----------------------------------------------------------

    def find(self, answer_id: str, owner: str | None) -> Held | None:
        """The answer with this id, if ``owner`` (a client key's name) started it."""
        held = self._held.get(answer_id)
        if held is None or held.owner != owner:
            return None
        return held

    def start(self, held: Held) -> None:
        """Hold ``held`` and start producing it (in the proxy's task group when it runs one);
        :class:`Full` when there is no room for it."""
        self._make_room(held.owner, refuse=True)
        self._hold(held)
        if self.tasks is not None:
            if self.shared is not None:
                held.outbox = []
                self._keep(held, whole=True)
            self.tasks.start_soon(self._produce, held)

    async def produce_here(self, held: Held) -> None:
        """Produce ``held`` in the caller's task (no task group of the proxy's)."""
        await self._produce(held)

    async def stop(self, held: Held) -> None:
        """Stop the answer on purpose: the upstream closed, the partial ends it (returns once
        it has)."""
        if held.log.ended:
            return
        shared = self.shared
        if shared is not None and (held.shadow or (held.parked and held.writes)):
            # Written where every process reads it: whoever produces the answer, or would
            # take it on, ends it instead — a stopped answer is never continued.
            await shared.ask_stop(held.id)
            if held.parked and held.writes and held.keeping:  # still this process's to write
                held.parked = False
                held.stopped()  # its keeper writes the end
                held.ended_at = self.clock()
                await self._ended(held)
                return
            if held.parked and held.writes:
                await self._take_on(held)  # ends it here, unless another process has it
            with anyio.move_on_after(5.0):
                while not held.log.ended:
                    await held.log.changed(len(held.log.events))
            return
        if held._scope is not None:
            held._stopping = True
            held._scope.cancel()
            while not held.log.ended:
                await held.log.changed(len(held.log.events))
        else:  # parked: nothing runs
            held.parked = False
            held.stopped()
            held.ended_at = self.clock()
            await self._ended(held)

    async def _ended(self, held: Held) -> None:
        """``held`` ended here: tell :attr:`on_end` (shielded: an end is told once)."""
        if self.on_end is not None:
            with anyio.CancelScope(shield=True):
                await self.on_end(held)

    def drop(self, held: Held) -> None:
        """Forget an answer now (a deleted response)."""
        self._forget(held)

    # -- reading ------------------------------------------------------------------------

    @contextlib.contextmanager
    def reading(self, held: Held) -> Iterator[None]:
        """A reader is here: a parked answer starts again; when the last goes, its hold."""
        held.readers += 1
        held.reads += 1
        if held.parked and not held.log.ended and self.tasks is not None:
            held.parked = False
            self.tasks.start_soon(self._unpark, held)
        try:
            yield
        finally:
            held.readers -= 1
            if not held.readers and held.producing and not (held.call.background or held.log.ended):
                held._lingers += 1
                if self.limits.hold <= 0 or self.tasks is None:
                    self._park(held)
                else:
                    # By a weak reference: an answer that ends and is pushed out meanwhile is
                    # not kept alive by its timer (its memory goes when the store lets it go).
                    self.tasks.start_soon(self._linger, weakref.ref(held), held._lingers)

    async def follow(self, held: Held, after: int = -1) -> AsyncIterator[tuple[bytes, bool]]:
        """The answer's events after number ``after``, then each new one, to its end: each
        piece with whether it is the last (then the response's end goes with it)."""
        data, i = held.after(after)
        while True:
            if data:
                after = held.blocks.number(i - 1)
                yield data, held.read_all(i)
            elif held.successor is not None:  # produced elsewhere now: read on from its log
                held, i = held.successor, 0
            elif held.read_all(i):
                return
            else:
                await held.moved()
            data, i = held.after(after, i)

    # -- producing ----------------------------------------------------------------------

    async def _produce(self, held: Held) -> None:
        if held._scope is not None or held.log.ended:
            return
        held.parked, held.ended_at = False, None
        self._producing += 1
        try:
            await self._producing_one(held)
        finally:
            self._producing -= 1
            if not self._producing and self._idle is not None:
                self._idle.set()
                self._idle = None

    async def _producing_one(self, held: Held) -> None:
        with anyio.CancelScope() as scope:
            held._scope = scope
            try:
                left = held.deadline_at - self.clock()
                if left <= 0:
                    raise streamres.DeadlineExceeded(
                        "the answer's deadline passed while it waited for its reader",
                        reason="deadline",
                        partial_text=held.log.text,
                    )
                with within(held.context):  # the answer's span, if traced, is the caller's child
                    answer = self.client.stream(
                        held.call.messages,
                        model=held.chain,
                        cache_scope=held.tenant,
                        deadline=left,
                        continue_from=held.log.text,
                        **held.kwargs,
                    )
                async with answer as events:
                    async for ev in events:
                        held.add(ev)
                        if held.added is not None and ev.type == "done":
                            answer.set_attribute("streamres.proxy.added_ms", held.added)
                        if held.log.ended and held.readers:
                            # Its readers send the end before this task closes the upstream
                            # response and settles the answer's accounts.
                            await anyio.lowlevel.checkpoint()
            except streamres.StreamError as exc:
                held.fail(without_urls(exc, self.client.routes))
            except anyio.get_cancelled_exc_class():
                raise
            except Exception as exc:  # a bug of the proxy's: this answer ends, the rest run
                log.warning(
                    "streamres.proxy_answer_crashed",
                    answer=held.id,
                    error=f"{type(exc).__name__}: {exc}",
                )
                held.fail(streamres.StreamError(f"the proxy failed: {type(exc).__name__}"))
            finally:
                held._scope = None
        if held.lost:  # another process produces it now (``_stand_down``)
            await self._give_back(held)
            return
        if held.log.ended:
            held.ended_at = self.clock()
            if held.added is not None and self.on_answered is not None:
                self.on_answered(held.call, held.added)
            await self._ended(held)
        elif held._stopping:
            held.stopped()
            held.ended_at = self.clock()
            await self._ended(held)
        elif held.readers and self.tasks is not None:
            # A reader came while the upstream was being closed for want of one: on again.
            self.tasks.start_soon(self._produce, held)
        else:  # cancelled without a stop: parked (its hold passed) — or the proxy stops
            held.parked, held.began = True, None  # its time parked is not the proxy's
            held.ended_at = self.clock()
            held.notify()
        if held.log.ended or held.parked:
            await self._give_back(held)

    async def _give_back(self, held: Held) -> None:
        """It stopped running: its key's slot goes back (shielded: a stop still counts)."""
        slot, held.slot = held.slot, None
        if slot is not None:
            with anyio.CancelScope(shield=True):
                await slot.give_back()

    def _park(self, held: Held) -> None:
        if held._scope is not None:
            held._scope.cancel()

    async def _linger(self, ref: weakref.ref[Held], turn: int) -> None:
        await anyio.sleep(self.limits.hold)
        held = ref()
        if held is not None and held.readers == 0 and held._lingers == turn and held.producing:
            self._park(held)

    async def _unpark(self, held: Held) -> None:
        """A reader came for a parked answer: produce it on — with shared state, from the
        shared log's word (another process may have continued it meanwhile, or have it now:
        then follow that one)."""
        if self.shared is not None and held.writes and not await self._take_on(held):
            await self._give_back(held)  # it ended, or runs elsewhere
            return
        await self._produce(held)

    # -- shared state: the answer in Redis ------------------------------------------------

    async def refresh(self, held: Held) -> None:
        """Before a parked answer held here is read: what other processes added to its log
        since it was parked is applied (the shared log over this copy)."""
        if (
            self.shared is not None
            and held.parked
            and held.writes
            and not held.keeping
            and not held.log.ended
        ):
            await self._catch_up(held)

    async def _catch_up(self, held: Held) -> None:
        """Apply what the answer's log in Redis holds past this copy."""
        shared = self.shared
        assert shared is not None
        while not held.log.ended:
            got = await shared.entries(held.id, held.entry, 0)
            if not got:
                return
            self._apply(held, got)

    async def _take_on(self, held: Held) -> bool:
        """Take on a parked answer this process wrote: True when this process produces it on
        (its keeper writing again); False when it ended (a stop asked for anywhere ends it
        here) or another process has it (this copy then follows that one)."""
        shared = self.shared
        assert shared is not None
        if held.keeping:
            # Its keeper still writes (Redis away, or slow): this process is its writer yet,
            # and the log may hold a write of its own not yet acknowledged — not another's.
            held.parked = False
            return True
        await self._catch_up(held)
        taken = await shared.take(held.id)
        if taken is not None and not taken.taken and taken.logged >= 0:
            held.outbox = None
            if not held.log.ended:  # another process produces it: follow it
                held.shadow, held.parked = True, False
                if self.tasks is not None:
                    self.tasks.start_soon(self._follow_shared, held)
            return False
        if taken is not None and taken.taken:
            await self._catch_up(held)  # what landed between the look and the take
        # Taken — or Redis is away or lost the answer: the keeper writes it (whole) when it can.
        held.parked = False
        if taken is not None and taken.stop:
            held.stopped()
            held.ended_at = self.clock()
            await self._keep_now(held)
            return False
        self._keep(held, whole=taken is None or taken.logged < 0)
        return not held.log.ended

    def _whole(self, held: Held) -> list[tuple[dict[str, Any] | None, bytes]]:
        """The whole answer as one write: every event, every byte."""
        data = held.blocks.join(0, len(held.blocks))
        return [*((event_json(ev), b"") for ev in held.log.events), (None, data)]

    def _keep(self, held: Held, *, whole: bool) -> None:
        """Start the answer's keeper, unless it has one running: one writer per answer in a
        process (a second would write from the first one's count)."""
        if not held.keeping and self.tasks is not None:
            held.keeping = True
            self.tasks.start_soon(self._keeper, held, whole)

    async def _keep_now(self, held: Held) -> None:
        """Write what the answer has made (its end) before going on — by its running keeper,
        if it has one (then this does not wait)."""
        if not held.keeping:
            held.keeping = True
            await self._keeper(held, False)

    async def _keeper(self, held: Held, whole: bool) -> None:
        try:
            await self._keeping(held, whole)
        finally:
            held.keeping = False

    async def _keeping(self, held: Held, whole: bool) -> None:
        """Write what the answer makes to Redis and hold its lease; readers get each event
        once Redis has it (one round trip: what comes meanwhile goes in the next write).
        ``whole``: the first write is the whole answer with its meta (a new answer, or one
        Redis lost). On its end, the last write and its expiry; parked, the lease given up;
        another process owning it, this copy stands down. Redis away: the answer is this
        process's alone until it answers again, then written on."""
        shared = self.shared
        assert shared is not None
        held.durable = len(held.blocks)
        renew = LEASE_MS / 3000
        held.renewed = self.clock()
        while held.outbox is not None:
            if not whole:
                if not held.outbox and not held.log.ended and not held.parked:
                    with anyio.move_on_after(renew):
                        await held.moved()
                if held.durable and held.outbox:  # past the first event: let more come with it
                    with anyio.move_on_after(FLUSH):
                        while not held.log.ended:
                            await held.moved()
                if held.outbox is None:
                    return
            upto, ended = len(held.blocks), held.log.ended
            entries = self._whole(held) if whole else held.outbox
            held.outbox = []
            got = await self._write(held, entries, held.status if ended else None, whole)
            if got == "gone":  # Redis lost it (a restart, a flush): the whole answer again
                whole = True
                continue
            if got == "lost":
                self._stand_down(held)
                return
            whole = False
            held.renewed = self.clock()
            held.durable = max(upto, held.durable or 0)
            held.notify()
            if ended:
                held.outbox, held.written = None, True
                return
            if got == "stop" and held._scope is not None:
                held._stopping = True  # another process's reader pressed Stop
                held._scope.cancel()
            if held.parked:
                await shared.release(held.id)
                held.notify()
                return

    async def _write(
        self,
        held: Held,
        entries: list[tuple[dict[str, Any] | None, bytes]],
        end: str | None,
        whole: bool,
    ) -> str:
        """One write, until Redis takes it: while it does not answer, readers wait as long as
        the lease may still stand, then are served from here alone, and the same write is
        sent again once Redis is back (it lands once). Alone only when this process held the
        lease as Redis went away: one that was itself stalled past it (its last renewal over
        a lease ago) may have lost the answer, and its readers wait for Redis to say."""
        shared = self.shared
        assert shared is not None
        held_it = self.clock() - held.renewed < LEASE_MS / 1000
        got = await shared.write(held, entries, end, whole=whole)
        if got is None:
            with anyio.move_on_after(LEASE_MS / 1000 - 0.5):
                await shared.shared.back()
        while got is None:
            if not shared.shared.connected:
                if held_it and held.durable is not None:
                    log.warning("streamres.proxy_answer_alone", answer=held.id)
                    self._alone(held)
                await shared.shared.back()
            got = await shared.write(held, entries, end, whole=whole)
        return got

    def _stand_down(self, held: Held) -> None:
        """Another process owns the answer now (this one stalled past its lease, or was cut
        off from Redis): its producer here stops at once, and its readers read on from the
        shared log."""
        why = self.shared.lost_why if self.shared is not None else ""
        log.warning("streamres.proxy_answer_taken_over", answer=held.id, found=why)
        held.lost, held.outbox = True, None
        if held._scope is not None:
            held._scope.cancel()
        self._forget(held)
        if self.tasks is not None:
            self.tasks.start_soon(self._hand_over, held)

    async def _hand_over(self, held: Held) -> None:
        successor = await self.find_shared(held.id, held.owner)
        if successor is None:  # gone from Redis too: what was written is all there is
            if held.durable is not None:
                held.blocks.truncate(held.durable)
            held.durable = None
            held.fail(
                streamres.StreamError(
                    "the answer moved to another proxy process and cannot be read from here",
                    partial_text=held.log.text,
                )
            )
        else:
            successor.moved_from.append(held)
            held.successor = successor
        held.notify()

    def _alone(self, held: Held) -> None:
        held.durable = None
        held.notify()

    async def rewrite_all(self) -> None:
        """Redis came back without the answers (a restart, a flush): every answer this
        process wrote and holds — ended or parked — written again whole (a running one's
        keeper finds it gone by itself)."""
        shared = self.shared
        assert shared is not None
        for held in list(self._held.values()):
            if held.keeping:  # its keeper writes it whole when it finds it gone
                continue
            if held.written:
                await shared.write(held, self._whole(held), held.status, whole=True)
            elif (
                held.parked
                and held.writes
                and await shared.write(held, self._whole(held), None, whole=True) == "written"
            ):
                await shared.release(held.id)

    async def _after_losses(self) -> None:
        """Watch for Redis coming back, or turning out to have lost its data (a restart, a
        flush: the mark every process keeps there changed), then write again what it lost."""
        shared = self.shared
        assert shared is not None
        rejoined = shared.shared.rejoined_at
        mark = await shared.since()
        while True:
            await anyio.sleep(1.0)
            now = await shared.since()
            if now is None:
                continue
            if rejoined != shared.shared.rejoined_at or (mark is not None and now[1] != mark[1]):
                await self.rewrite_all()
                if self.on_loss is not None:
                    await self.on_loss()
            rejoined, mark = shared.shared.rejoined_at, now

    async def find_shared(self, answer_id: str, owner: str | None) -> Held | None:
        """An answer another process holds (or held), found in Redis: a shadow of it here,
        which follows its log — and adopts it, when its process is gone. One lookup at a
        time per answer: concurrent readers share the shadow it makes."""
        while (looking := self._finding.get(answer_id)) is not None:
            await looking.wait()
        if answer_id in self._held:
            return self.find(answer_id, owner)
        self._finding[answer_id] = looking = anyio.Event()
        try:
            return await self._find_shared(answer_id, owner)
        finally:
            del self._finding[answer_id]
            looking.set()

    async def _find_shared(self, answer_id: str, owner: str | None) -> Held | None:
        shared = self.shared
        if shared is None or not shared.shared.connected:
            return None
        meta = await shared.meta(answer_id)
        if not meta or (meta.get("owner") or None) != owner or "call" not in meta:
            return None
        try:
            call = call_from(meta)
            writer = Writer(
                call,
                model=meta["model"],
                status_events=bool(meta["status_events"]),
                answer=meta["answer"],
                created=int(meta["created"]),
            )
            left = float(meta["deadline"]) - time.time()
            held = Held(
                writer,
                call,
                owner,
                json.loads(meta["chain"]),
                json.loads(meta["kwargs"]),
                meta["tenant"] or None,
                anyio.current_time() + left,
            )
        except (KeyError, ValueError, TypeError) as exc:
            log.warning("streamres.proxy_answer_unreadable", answer=answer_id, error=str(exc))
            return None
        held.shadow = True
        await self._catch_up(held)  # what the log holds now, before any reader
        self._make_room(owner, refuse=False)
        self._hold(held)
        if held.log.ended:
            held.ended_at = self.clock()
        elif self.tasks is not None:
            self.tasks.start_soon(self._follow_shared, held)
        return held

    def _apply(self, held: Held, entries: list[Any]) -> None:
        """Log entries from Redis, applied to this copy (:meth:`Held.apply`); bytes made
        other than its producer's are said once."""
        me = self.shared.shared.id if self.shared is not None else None
        if not held.apply(entries, me) and not self._mismatch:
            self._mismatch = True
            log.warning("streamres.proxy_answer_replay_differs", answer=held.id)

    async def _follow_shared(self, held: Held) -> None:
        """Follow a shadow's log to the answer's end; adopt it if its process is gone (a
        stop asked for meanwhile ends it instead); let it go when nobody has read it for
        ``hold`` seconds."""
        shared = self.shared
        assert shared is not None
        idle = self.clock()
        while not held.log.ended and held.shadow:
            got = await shared.entries(held.id, held.entry, 100)
            if got:
                self._apply(held, got)
                continue
            if held.read_anywhere():
                idle = self.clock()
            elif self.clock() - idle > self.limits.hold + 1:
                self._forget(held)  # a later reader makes a new shadow
                return
            if got is None or shared.settling():  # Redis away, or its writers not back yet
                await anyio.sleep(0.5)
                continue
            taken = await shared.take(held.id)
            if taken is None or not (taken.taken or taken.logged < 0):
                continue
            if not taken.taken and await shared.unsure():
                continue  # Redis lost it lately: its process may still write it again
            # Its process is gone (or Redis lost the answer and nobody wrote it again): this
            # process takes it on, from what was delivered.
            log.info("streamres.proxy_answer_adopted", answer=held.id, chars=len(held.log.text))
            held.shadow = False
            held.outbox, held.durable = [], len(held.blocks)
            if taken.taken:
                await self._catch_up(held)
            if taken.stop:
                held.stopped()
                held.ended_at = self.clock()
                await self._keep_now(held)
                return
            assert self.tasks is not None
            self._keep(held, whole=not taken.taken)
            if not held.call.background and not held.read_anywhere():
                held._lingers += 1  # its reader went meanwhile: its hold, as for any answer
                self.tasks.start_soon(self._linger, weakref.ref(held), held._lingers)
            await self._produce(held)
            return
        if held.log.ended:
            held.ended_at = self.clock()

    # -- forgetting ---------------------------------------------------------------------

    def _hold(self, held: Held) -> None:
        self._held[held.id] = held
        held.ledger, held.counted = self._ledger, 0
        held.weigh()

    def _forget(self, held: Held) -> None:
        if self._held.get(held.id) is held:
            del self._held[held.id]
            self._ledger.add(held.owner, -held.counted)
            held.ledger, held.counted = None, 0

    def _make_room(self, owner: str | None, *, refuse: bool) -> None:
        """Room for one more answer of ``owner``'s (a client key's name). Past a bound —
        ``max_answers``, ``max_bytes``, the key's ``max_bytes_per_key`` — the key's own
        answers that stopped running go first, longest-ended first; another key's answer is
        never forgotten for it before ``keep`` has passed. ``refuse``: :class:`Full` when
        that is not room enough (a shadow of another process's answer is held all the
        same: it is read now). What is held is counted as it grows (:class:`Ledger`): while
        there is room, this looks at no answer."""
        limits, ledger = self.limits, self._ledger
        per_key = limits.max_bytes_per_key if owner is not None else limits.max_bytes

        def full() -> bool:
            return len(self._held) + 1 > limits.max_answers or ledger.total > limits.max_bytes

        if full() or ledger.by_owner.get(owner, 0) > per_key:
            own = sorted(
                (
                    h
                    for h in self._held.values()
                    if h.owner == owner
                    and h.ended_at is not None
                    and not h.producing
                    and not h.readers
                ),
                key=lambda h: h.ended_at or 0.0,
            )
            for h in own:
                if not full() and ledger.by_owner.get(owner, 0) <= per_key:
                    break
                self._forget(h)
            if full():
                self.sweep()  # others' past ``keep``
        if not refuse:
            return
        mine = ledger.by_owner.get(owner, 0)
        if mine > per_key:
            raise Full(
                429,
                f"{owner} holds {mine // 2**20} MiB of answers (at most "
                f"{per_key // 2**20} MiB): read or stop one, or wait for one to end",
            )
        if full():
            raise Full(503, "the proxy holds all the answers it can now; try again shortly")

    def _grown(self, owner: str | None) -> None:
        """An answer grew past the bound: room made as for a new one (what stopped running
        goes first), so what is held stays near ``max_bytes`` as answers in flight grow."""
        self._make_room(owner, refuse=False)

    def sweep(self, now: float | None = None) -> None:
        """Forget what ended (or was parked) over ``keep`` seconds ago and has no reader."""
        now = self.clock() if now is None else now
        for h in list(self._held.values()):
            if (
                h.ended_at is not None
                and not h.producing
                and h.readers == 0
                and now - h.ended_at > self.limits.keep
            ):
                self._forget(h)

    async def _sweep(self) -> None:
        while True:
            await anyio.sleep(min(30.0, max(1.0, self.limits.keep / 10)))
            self.sweep()
