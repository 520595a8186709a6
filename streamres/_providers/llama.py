"""llama.cpp's server keeps a stream to read again (``tools/server/server-stream.cpp``). Pure.

A chat completion sent with ``X-Conversation-Id: <id>`` runs to its end whatever happens to its
connection: the server copies every byte of the response body into a session (up to 4 MiB, kept
five minutes after the end). ``GET /v1/stream?conv_id=<id>&from=<byte>`` sends the body again
from that byte offset — replayed, then followed live until the generation ends — so a client
whose connection dropped reads on exactly where it broke, and nothing is generated twice.
``DELETE /v1/stream?conv_id=<id>`` stops the generation and forgets the session (204, known or
not). A server shows it is llama.cpp's in every response: ``server: llama.cpp``.

Other servers ignore the header; streamres sends it on every Chat Completions request, one id
per attempt, random and carrying nothing of the conversation.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import quote

from streamres._providers.openai import headers
from streamres._providers.wire import HttpRequest

__all__ = ["CONVERSATION_HEADER", "keeps_streams", "replay_request", "stop_request"]

#: The request header that opens a session.
CONVERSATION_HEADER = "X-Conversation-Id"


def keeps_streams(response_headers: Mapping[str, str]) -> bool:
    """Does a response come from llama.cpp's server (which keeps stream sessions)?"""
    return response_headers.get("server", "").lower().startswith("llama.cpp")


def _stream_url(base_url: str, conversation: str) -> str:
    """``/v1/stream`` at the server's root (a route's base URL ends in ``/v1``)."""
    root = base_url.rstrip("/")
    root = root.removesuffix("/v1")
    return f"{root}/v1/stream?conv_id={quote(conversation, safe='')}"


def replay_request(
    *,
    base_url: str,
    api_key: str | None,
    conversation: str,
    start: int,
    extra_headers: dict[str, str],
) -> HttpRequest:
    """Read a session's body again from byte ``start``."""
    return HttpRequest(
        url=f"{_stream_url(base_url, conversation)}&from={start}",
        headers=headers(api_key, extra_headers),
        method="GET",
    )


def stop_request(
    *, base_url: str, api_key: str | None, conversation: str, extra_headers: dict[str, str]
) -> HttpRequest:
    """Stop a session's generation and forget it."""
    return HttpRequest(
        url=_stream_url(base_url, conversation),
        headers=headers(api_key, extra_headers),
        method="DELETE",
    )
