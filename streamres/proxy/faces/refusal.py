"""A request the proxy refuses itself, with the status and words its client's API gives it."""

from __future__ import annotations

__all__ = ["Refused"]


class Refused(Exception):
    """A request refused: its status, why, and when to come back."""

    def __init__(
        self,
        status: int,
        message: str,
        retry_after: float | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.retry_after = status, message, retry_after
        #: The error's code in OpenAI's shape, when not the status's usual one.
        self.code = code
