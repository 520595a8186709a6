"""A request's input tokens asked of the route's own API (``POST /v1/messages/count_tokens``,
``POST /v1/responses/input_tokens``), for the proxy's token counts. I/O shell."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import httpx

import streamres
from streamres._shell.apps import load_counter
from streamres.proxy.answers.conversations import Conversations
from streamres.proxy.config import Config
from streamres.proxy.faces.counts import (
    MESSAGE_OVERHEAD,
    count_body,
    prompt_pieces,
    upstream_request,
)
from streamres.proxy.faces.inbound import API, BadRequest, Call, parse
from streamres.proxy.faces.refusal import Refused
from streamres.proxy.server import asgi
from streamres.proxy.server.admission import Admission
from streamres.proxy.server.asgi import Receive, Scope, Send

__all__ = ["serve", "upstream_count"]


async def serve(
    api: API,
    scope: Scope,
    receive: Receive,
    send: Send,
    config: Config,
    admission: Admission,
    routes: Sequence[streamres.Route],
    conversations: Conversations,
) -> None:
    """A request's input tokens: asked of the first route of its model's chain when that
    route's API counts them, else (or when it fails) counted here, an estimate
    (``x-streamres-count``: ``upstream`` or ``estimate``)."""
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    try:
        owner = admission.reader(headers)
        raw = await asgi.body(receive, config.server)
        call: Call = parse(api, raw)
        chain = config.models.get(call.model)
        if chain is None:
            raise Refused(404, f"the model {call.model!r} does not exist here")
        await conversations.follow_on(call, owner)
    except (Refused, BadRequest) as exc:
        refused = exc if isinstance(exc, Refused) else Refused(400, str(exc))
        await asgi.error(send, api, refused.status, str(exc), refused.retry_after)
        return
    route = next(r for r in routes if r.key == chain[0])
    asked = upstream_request(call, json.loads(raw), route)
    tokens = await upstream_count(*asked) if asked is not None else None
    how = b"upstream"
    if tokens is None:
        how = b"estimate"
        _, count = await load_counter(route.model)
        pieces = prompt_pieces(call)
        tokens = sum(count(p) for p in pieces) + MESSAGE_OVERHEAD * (len(call.messages) + 1)
    body = json.dumps(count_body(call, tokens)).encode()
    await asgi.respond(send, 200, body, "application/json", [(b"x-streamres-count", how)])


async def upstream_count(url: str, headers: dict[str, str], body: dict[str, Any]) -> int | None:
    """The route's own count (``None``: it gave none, and the proxy counts)."""
    try:
        async with httpx.AsyncClient(timeout=10.0, trust_env=True) as http:
            response = await http.post(url, headers=headers, json=body)
        tokens = response.json().get("input_tokens") if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return tokens if type(tokens) is int and tokens >= 0 else None
