"""Secrets kept out of every message, history entry and log line. Pure.

An upstream may echo the key it was sent in an error body ("Incorrect API key provided:
sk-abc…"), and a base URL may carry credentials (``https://user:KEY@host/v1``,
``?api-key=KEY``). streamres knows every secret it sends, so it removes each of them, wherever
it appears, from any text it shows or logs: the key itself, however the server quoted it (in
any case, shortened to its head or tail, or base64-encoded), and the credentials of a URL.
"""

from __future__ import annotations

import base64
import functools
import re
from collections.abc import Iterable
from urllib.parse import parse_qsl, urlsplit

__all__ = ["MASK", "Redactor", "redact_url", "url_secrets"]

MASK = "[redacted]"

#: Query parameters that carry credentials (Azure ``api-key``, Gemini ``key``, tokens…).
_SECRET_PARAMS = re.compile(r"(?i)^(api[-_]?key|key|token|access[-_]?token|sig|signature)$")
# A secret shorter than this is not searched for (it would mask ordinary words).
_MIN_SECRET = 6


def url_secrets(url: str) -> list[str]:
    """The credentials a URL carries: its password (and user name) and secret query values."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    found = [s for s in (parts.password, parts.username) if s]
    found += [v for k, v in parse_qsl(parts.query) if _SECRET_PARAMS.match(k) and v]
    return found


@functools.lru_cache(maxsize=256)  # a client's few routes, masked once each
def redact_url(url: str) -> str:
    """``url`` with its user information and secret query values masked."""
    out = re.sub(r"(?<=://)[^/@?#]*@", MASK + "@", url, count=1)
    return re.sub(
        r"(?i)([?&](?:api[-_]?key|key|token|access[-_]?token|sig|signature)=)[^&#]*",
        r"\g<1>" + MASK,
        out,
    )


class Redactor:
    """Masks a fixed set of secrets in any text.

    >>> Redactor(["sk-abcdef123"]).redact("Incorrect API key provided: sk-abcdef123.")
    'Incorrect API key provided: [redacted].'
    """

    __slots__ = ("_pattern",)

    def __init__(self, secrets: Iterable[str | None]) -> None:
        found = {s for s in secrets if s and len(s) >= _MIN_SECRET}
        # Servers often echo a key shortened ("sk-abc***xyz"); the long-enough head and tail
        # of a key are secrets too.
        for s in list(found):
            if len(s) >= 20:
                found.update((s[:12], s[-8:]))
        # A server may echo the key encoded: as the base64 of an ``Authorization: Basic``
        # header it rebuilt (``user:key``), or of the key alone. Whatever comes before it, the
        # key's bytes fall at one of three offsets in base64's groups of three; for each, the
        # characters made of the key's bytes alone are a secret.
        for s in [s for s in found if len(s) >= 12]:
            raw = s.encode()
            for offset in range(3):
                encoded = base64.b64encode(b"\0" * offset + raw).decode()
                whole = 4 * ((offset + len(raw)) // 3)  # groups of key bytes only at the end
                found.add(encoded[(0, 2, 3)[offset] : whole])
        alternatives = sorted(found, key=len, reverse=True)
        # Case folded too: an echo in upper case ("SK-ABC…") is the same key.
        self._pattern = (
            re.compile("|".join(re.escape(s) for s in alternatives), re.IGNORECASE)
            if alternatives
            else None
        )

    def redact(self, text: str) -> str:
        """``text`` with every secret, and every URL's credentials, masked."""
        if self._pattern is not None:
            text = self._pattern.sub(MASK, text)
        if "://" in text and ("@" in text or "=" in text):
            text = re.sub(r"\bhttps?://\S+", lambda m: redact_url(m.group(0)), text)
        return text
