"""A held answer's SSE blocks, numbered, kept compactly: what a held character costs.

A block is one SSE event as a reader gets it (a comment before an event travels in its block).
Nearly every block of an answer is a text delta, the same bytes around a different number and
text: such a block is kept as its text (escaped for JSON, as it goes on the wire) and its frame
(:class:`~streamres.proxy.faces.outbound.Frame`, one per run of deltas), and made again when a
reader asks for it. Any other block (an answer's start, a tool call, its end) is kept as its
bytes — but where it repeats the text of the deltas before it (the Responses API ends a text
item with its whole text, four times), that text is kept as where it lies among theirs. Per
block that is its bytes in one buffer and nine bytes of bookkeeping, where a block kept as a
``bytes`` object in a list of tuples cost about 180 bytes besides its encoding.
"""

from __future__ import annotations

from array import array

from streamres.proxy.faces.outbound import Frame

__all__ = ["Blocks"]

#: The shortest run of text worth keeping as a reference (bytes).
_WORTH = 256


class Blocks:
    """An answer's blocks in order; a block has a number (its event's ``id:``; a comment alone
    carries the number of the event before it, and is not *numbered*)."""

    def __init__(self) -> None:
        self._data = bytearray()
        self._ends = array("I")  # where each block's kept bytes end in ``_data``
        self._numbers = array("i")  # 2 * number + numbered (a number -1 before any event)
        self._forms = bytearray()  # 0: kept as its bytes; k: a delta in ``_frames[k - 1]``
        self._frames: list[Frame] = []
        self._frame_at: dict[Frame, int] = {}
        #: Blocks kept with a run of the deltas' text cut out: (where, start, end) — the
        #: block is its kept bytes with ``_data[start:end]`` put back at ``where``.
        self._cuts: dict[int, tuple[int, int, int]] = {}
        self._last_delta = (0, 0)  # where the last delta's text lies in ``_data``
        #: Bytes the blocks are on the wire.
        self.size = 0

    def __len__(self) -> int:
        return len(self._forms)

    def number(self, i: int) -> int:
        return self._numbers[i] >> 1

    def numbered(self, i: int) -> bool:
        return bool(self._numbers[i] & 1)

    @property
    def last_number(self) -> int:
        """The number of the last block (-1: none yet)."""
        return self._numbers[-1] >> 1 if self._forms else -1

    @property
    def nbytes(self) -> int:
        """What the blocks take in memory (their buffer and bookkeeping)."""
        return len(self._data) + 9 * len(self._forms) + 100 * len(self._cuts)

    def keep(self, data: bytes) -> None:
        """Encoded events (whole blocks, each ending in a blank line), kept as they are."""
        last = self.last_number
        for block in data.split(b"\n\n")[:-1]:
            block += b"\n\n"
            numbered = block.startswith(b"id: ")
            if numbered:
                last = int(block[4 : block.index(b"\n")])
            size = len(block)
            cut = self._repeats(block) if size > 2 * _WORTH else None
            if cut is not None:
                at, start, end = cut
                self._cuts[len(self._forms)] = (at, start, end)
                block = block[:at] + block[at + end - start :]
            self._push(2 * last + numbered, 0, block, size)

    def _repeats(self, block: bytes) -> tuple[int, int, int] | None:
        """The longest run of the deltas' text, ending with the last delta's, that ``block``
        repeats where the last delta's text ends in it (looked for from the block's end, a
        few places at most), when it is worth cutting out: (where in the block, and where in
        ``_data`` it starts and ends)."""
        a, b = self._last_delta
        if b - a == 0 or b < _WORTH:
            return None
        piece = bytes(self._data[a:b])
        with memoryview(self._data) as data, memoryview(block) as mine:
            at = block.rfind(piece)
            for _ in range(8):
                if at < 0:
                    return None
                stop = at + len(piece)
                if stop >= _WORTH and mine[stop - _WORTH : stop] == data[b - _WORTH : b]:
                    lo, hi = _WORTH, min(stop, b)  # how far back does the run go?
                    while lo < hi:
                        mid = (lo + hi + 1) // 2
                        if mine[stop - mid : stop] == data[b - mid : b]:
                            lo = mid
                        else:
                            hi = mid - 1
                    return stop - lo, b - lo, b
                at = block.rfind(piece, 0, stop - 1)
        return None

    def delta(self, frame: Frame, number: int, text: bytes) -> None:
        """A text delta: ``frame`` around ``number`` and ``text`` (escaped)."""
        form = self._frame_at.get(frame)
        if form is None:
            self._frames.append(frame)
            form = self._frame_at[frame] = len(self._frames)
        size = len(frame.head) + len(frame.tail) + len(text) + 4 + len(str(number))
        if frame.again is not None:
            size += len(frame.again) + len(str(number))
        self._push(2 * number + 1, form, text, size)
        self._last_delta = (len(self._data) - len(text), len(self._data))

    def _push(self, number: int, form: int, kept: bytes, size: int) -> None:
        self._data += kept
        self._ends.append(len(self._data))
        self._numbers.append(number)
        self._forms.append(form)
        self.size += size

    def block(self, i: int) -> bytes:
        start = self._ends[i - 1] if i else 0
        kept = bytes(self._data[start : self._ends[i]])
        cut = self._cuts.get(i)
        if cut is not None:
            at, a, b = cut
            kept = kept[:at] + self._data[a:b] + kept[at:]
        form = self._forms[i]
        return kept if not form else self._frames[form - 1].block(self._numbers[i] >> 1, kept)

    def join(self, start: int, end: int) -> bytes:
        """Blocks ``start`` to ``end`` as a reader gets them."""
        return b"".join([self.block(i) for i in range(start, end)])

    def had(self, i: int, number: int) -> bool:
        """Has a reader that had event ``number`` had block ``i``? (It had every block up to
        that event's own, not the comments after it.)"""
        v = self._numbers[i]
        return v < 2 * number or v == 2 * number + 1

    def after(self, number: int) -> int:
        """The first block past event ``number`` (the blocks a reader had come first)."""
        lo, hi = 0, len(self._forms)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.had(mid, number):
                lo = mid + 1
            else:
                hi = mid
        return lo

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` blocks only."""
        if n >= len(self._forms):
            return
        self.size -= sum(len(self.block(i)) for i in range(n, len(self._forms)))
        for i in [i for i in self._cuts if i >= n]:
            del self._cuts[i]
        del self._data[self._ends[n - 1] if n else 0 :]
        if self._last_delta[1] > len(self._data):
            self._last_delta = (0, 0)
        del self._ends[n:]
        del self._numbers[n:]
        del self._forms[n:]
