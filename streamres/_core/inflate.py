"""Content-Encoding, undone with a bound. Pure.

httpx would decompress a body for us, but without a bound: one 1 MB gzip read can expand to
1 GB in a single call (a "gzip bomb"), before any stall timer or deadline gets a chance to run.
So streamres reads the raw body and inflates it here, never producing more than ``limit``
bytes from one network read; past that the attempt fails as malformed (and the answer resumes).
``gzip`` and ``deflate`` (zlib-wrapped or raw, as servers send both) are what requests ask for;
any other encoding is refused as malformed.
"""

from __future__ import annotations

import zlib

__all__ = ["ACCEPT_ENCODING", "MAX_INFLATE", "InflateError", "Inflater"]

#: What requests advertise: the encodings this module undoes with a bound.
ACCEPT_ENCODING = "gzip, deflate"
#: Default bound on the bytes one network read may expand to.
MAX_INFLATE = 16 * 1024 * 1024


class InflateError(Exception):
    """The body cannot be decoded within the bound (corrupt, unsupported, or a bomb)."""


class Inflater:
    """``feed(raw) -> bytes`` for one response body's ``Content-Encoding``.

    >>> import gzip
    >>> Inflater("gzip").feed(gzip.compress(b"data: hi\\n\\n"))
    b'data: hi\\n\\n'
    """

    __slots__ = ("_fed", "_raw_deflate", "_z", "encoding", "limit")

    def __init__(self, encoding: str | None, *, limit: int = MAX_INFLATE) -> None:
        codings = [c.strip().lower() for c in (encoding or "").split(",") if c.strip()]
        codings = [c for c in codings if c != "identity"]
        self.encoding = ",".join(codings)
        self.limit = limit
        self._raw_deflate = False
        self._fed = False
        self._z: zlib._Decompress | None = None
        if not codings:
            return
        if len(codings) > 1 or codings[0] not in ("gzip", "x-gzip", "deflate"):
            raise InflateError(f"unsupported Content-Encoding {self.encoding!r}")
        # wbits 47: zlib or gzip header, detected; raw deflate is tried on the first error.
        self._z = zlib.decompressobj(47 if codings[0] != "deflate" else 15)
        self._raw_deflate = codings[0] == "deflate"

    def close(self) -> None:
        """The body ended: raise :class:`InflateError` if its compressed stream did not."""
        if self._z is not None and self._fed and not self._z.eof:
            raise InflateError(f"the {self.encoding} body ended before its compressed stream did")

    @property
    def identity(self) -> bool:
        return self._z is None

    def feed(self, raw: bytes) -> bytes:
        """The decoded bytes of the next raw chunk (at most ``limit`` of them)."""
        z = self._z
        if z is None:
            return raw
        try:
            out = z.decompress(raw, self.limit)
        except zlib.error as exc:
            if not self._raw_deflate:
                raise InflateError(f"corrupt {self.encoding} body ({exc})") from None
            # Some servers send raw deflate under "deflate": try once more without a header.
            self._raw_deflate = False
            self._z = zlib.decompressobj(-15)
            return self.feed(raw)
        self._raw_deflate = False
        self._fed = True
        if z.unconsumed_tail:
            raise InflateError(
                f"one read of the {self.encoding} body expands past {self.limit} bytes"
            )
        return out
