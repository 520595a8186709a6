"""Server-sent events, decoded without I/O.

Theory of operation: the caller feeds raw body bytes as they arrive, in chunks of any size,
and gets back the complete events those bytes finished. An event is ``(name, data)``: the
``event:`` field (``""`` when absent) and the ``data:`` lines joined by ``\\n``, kept as bytes
because ``json.loads`` takes bytes directly and decoding twice is wasted work on the hot path.

Lines may end in ``\\n``, ``\\r\\n`` or a lone ``\\r`` (the SSE specification allows all three),
and a ``\\r\\n`` pair may be split across two chunks, so a trailing ``\\r`` is held back until
the next chunk says what it was. Comment lines (``: ping``) are counted, not returned: they prove
the socket is alive, never that the model is producing.
"""

from __future__ import annotations

__all__ = ["SSEDecoder", "SSEEvent"]

SSEEvent = tuple[str, bytes]


class SSEDecoder:
    """Incremental SSE decoder: ``feed(bytes) -> list[SSEEvent]``.

    >>> d = SSEDecoder()
    >>> d.feed(b'data: {"a": 1}\\n') + d.feed(b"\\n")
    [('', b'{"a": 1}')]
    """

    __slots__ = ("_buf", "_data", "_name", "_started", "comments")

    def __init__(self) -> None:
        self._buf = b""
        self._name = ""
        self._data: list[bytes] = []
        self._started = False
        #: Number of comment lines seen (keep-alives such as ``: ping``).
        self.comments = 0

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Take the next bytes of the body; return the events they complete."""
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
                return self._lines(lines)
        lines = buf.split(b"\n")
        self._buf = lines.pop()
        return self._lines(lines)

    def close(self) -> list[SSEEvent]:
        """Signal end of body. Returns an event only if the body ended right after a line.

        A half-received event (no terminating blank line) is discarded, as the specification
        says: a stream cut in the middle of an event did not deliver it.
        """
        buf, self._buf = self._buf, b""
        out: list[SSEEvent] = []
        if buf.endswith(b"\r"):
            out = self._lines([buf[:-1]])
        self._name, self._data = "", []
        return out

    def _lines(self, lines: list[bytes]) -> list[SSEEvent]:
        out: list[SSEEvent] = []
        data = self._data
        for line in lines:
            if not line:
                if data:
                    out.append((self._name, data[0] if len(data) == 1 else b"\n".join(data)))
                    data = self._data = []
                self._name = ""
            elif line.startswith(b"data:"):
                value = line[5:]
                data.append(value[1:] if value[:1] == b" " else value)
            elif line[0] == 58:  # b":" comment
                self.comments += 1
            else:
                field, sep, value = line.partition(b":")
                if sep and value[:1] == b" ":
                    value = value[1:]
                if field == b"event":
                    self._name = value.decode("utf-8", "replace")
                elif field == b"data":  # "data" with no colon: an empty data line
                    data.append(b"")
                # "id" and "retry" carry nothing an LLM stream needs; unknown fields are ignored.
        return out
