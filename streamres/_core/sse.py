"""Server-sent events, decoded without I/O.

Theory of operation: the caller feeds raw body bytes as they arrive, in chunks of any size,
and gets back the complete events those bytes finished. An event is ``(name, data)``: the
``event:`` field (``""`` when absent) and the ``data:`` lines joined by ``\\n``, kept as bytes
because ``json.loads`` takes bytes directly and decoding twice is wasted work on the hot path.

Lines may end in ``\\n``, ``\\r\\n`` or a lone ``\\r`` (the SSE specification allows all three),
and a ``\\r\\n`` pair may be split across two chunks, so a trailing ``\\r`` is held back until
the next chunk says what it was. Comment lines (``: ping``) are counted, not returned: they prove
the socket is alive, never that the model is producing.

Bounds, whatever the server sends: a line still waiting for its end is kept as a list of the
pieces that brought it and joined once, when the end arrives, so a long line costs linear time
(re-joining on every read would be quadratic). A line longer than ``max_line`` bytes, or an
event whose data lines add up to more than ``max_event`` bytes (``data:`` lines that never end
their event), stops the decoder: ``overflow`` says what happened, what it held is dropped, and
``feed`` returns nothing more. The caller treats that as a malformed stream.
"""

from __future__ import annotations

__all__ = ["MAX_EVENT", "MAX_LINE", "SSEDecoder", "SSEEvent"]

SSEEvent = tuple[str, bytes]

#: Default bound on one line (bytes): far above any real chunk (a Responses API
#: ``response.completed`` carrying a whole long answer is well under 1 MiB).
MAX_LINE = 4 * 1024 * 1024
#: Default bound on the data of one event (bytes).
MAX_EVENT = 8 * 1024 * 1024


class SSEDecoder:
    """Incremental SSE decoder: ``feed(bytes) -> list[SSEEvent]``.

    >>> d = SSEDecoder()
    >>> d.feed(b'data: {"a": 1}\\n') + d.feed(b"\\n")
    [('', b'{"a": 1}')]
    """

    __slots__ = (
        "_buf",
        "_data",
        "_data_len",
        "_name",
        "_pending",
        "_pending_len",
        "_started",
        "comments",
        "max_event",
        "max_line",
        "overflow",
    )

    def __init__(self, *, max_line: int = MAX_LINE, max_event: int = MAX_EVENT) -> None:
        self._buf = b""
        #: Pieces of a line longer than one read, joined only once its end arrives.
        self._pending: list[bytes] = []
        self._pending_len = 0
        self._name = ""
        self._data: list[bytes] = []
        self._data_len = 0
        self._started = False
        self.max_line = max_line
        self.max_event = max_event
        #: Number of comment lines seen (keep-alives such as ``: ping``).
        self.comments = 0
        #: Why the decoder stopped (a bound was crossed), or ``None``.
        self.overflow: str | None = None

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Take the next bytes of the body; return the events they complete."""
        if self.overflow is not None:
            return []
        if (
            b"\n" not in chunk
            and b"\r" not in chunk
            and (self._buf or self._pending)
            and not self._buf.endswith(b"\r")
        ):
            # Still inside one long line: keep the piece, copy nothing.
            if self._buf:
                self._pending.append(self._buf)
                self._pending_len += len(self._buf)
                self._buf = b""
            self._pending.append(chunk)
            self._pending_len += len(chunk)
            if self._pending_len > self.max_line:
                return self._stop(f"an event-stream line longer than {self.max_line} bytes")
            return []
        if self._pending:
            self._pending.append(self._buf)
            self._pending.append(chunk)
            buf = b"".join(self._pending)
            self._pending, self._pending_len = [], 0
        else:
            buf = self._buf + chunk if self._buf else chunk
        if not self._started and buf:
            if len(buf) < 3 and b"\xef\xbb\xbf".startswith(buf):
                self._buf = buf
                return []
            self._started = True
            if buf.startswith(b"\xef\xbb\xbf"):
                buf = buf[3:]
        if b"\r" in buf:
            # Rare path: servers that end lines in CR or CRLF.
            held = buf.endswith(b"\r")
            if held:
                buf = buf[:-1]
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            if held:
                # Keep the CR undecided, and keep the line it ends from being dispatched.
                lines = buf.split(b"\n")
                self._buf = lines.pop() + b"\r"
                return self._checked(lines)
        lines = buf.split(b"\n")
        self._buf = lines.pop()
        return self._checked(lines)

    def close(self) -> list[SSEEvent]:
        """Signal end of body. Returns an event only if the body ended right after a line.

        A half-received event (no terminating blank line) is discarded, as the specification
        says: a stream cut in the middle of an event did not deliver it.
        """
        if self.overflow is not None:
            return []
        buf, self._buf = self._buf, b""
        self._pending, self._pending_len = [], 0
        out: list[SSEEvent] = []
        if buf.endswith(b"\r"):
            out = self._lines([buf[:-1]])
        self._name, self._data, self._data_len = "", [], 0
        return out

    def _stop(self, why: str) -> list[SSEEvent]:
        self.overflow = why
        self._buf, self._pending, self._pending_len = b"", [], 0
        self._data, self._data_len = [], 0
        return []

    def _checked(self, lines: list[bytes]) -> list[SSEEvent]:
        if len(self._buf) > self.max_line:
            return self._stop(f"an event-stream line longer than {self.max_line} bytes")
        return self._lines(lines)

    def _lines(self, lines: list[bytes]) -> list[SSEEvent]:
        out: list[SSEEvent] = []
        data = self._data
        size = self._data_len  # kept in locals: this loop runs once per line of the stream
        max_line, max_event = self.max_line, self.max_event
        for line in lines:
            if not line:
                if data:
                    out.append((self._name, data[0] if len(data) == 1 else b"\n".join(data)))
                    data = self._data = []
                    size = 0
                self._name = ""
                continue
            if len(line) > max_line:
                self._stop(f"an event-stream line longer than {max_line} bytes")
                return out
            if line.startswith(b"data:"):
                value = line[5:]
                if value[:1] == b" ":
                    value = value[1:]
            elif line[0] == 58:  # b":" comment
                self.comments += 1
                continue
            else:
                field, sep, value = line.partition(b":")
                if sep and value[:1] == b" ":
                    value = value[1:]
                if field == b"event":
                    self._name = value.decode("utf-8", "replace")
                    continue
                if field != b"data":
                    # "id" and "retry" carry nothing an LLM stream needs; unknown fields are
                    # ignored.
                    continue
                value = b""  # "data" with no colon: an empty data line
            data.append(value)
            size += len(value) + 1
            if size > max_event:
                self._stop(f"an event's data longer than {max_event} bytes")
                return out
        self._data_len = size
        return out
