"""The next request of an answer: the first, a continuation of what was delivered, or a
re-attachment to a background response. Pure.

A continuation resubmits the partial answer so the model continues it: by *prefill* (the
partial as a final assistant message, continued by the server) or by *instruct* (asked, in
words, to go on), chosen per route (``continuation.choose``) and remembered per server (a
server that refused a prefill is asked by instruct from then on; one that names itself as
continuing a final assistant message is resumed by prefill). Its text goes through a
:class:`~streamres._core.dedup.Deduplicator` built here, which removes what the model repeats.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from streamres._answer.memory import Memory
from streamres._answer.options import Options
from streamres._core.continuation import Strategy, build_continuation, choose
from streamres._core.dedup import Deduplicator, hold_back
from streamres._core.tokens import token_starts
from streamres._fleet.routes import Route
from streamres._providers import anthropic as _anthropic
from streamres._providers import openai as _openai
from streamres._providers import responses as _responses
from streamres._providers.wire import HttpRequest, StreamDecoder

__all__ = [
    "PROVIDERS",
    "Continuation",
    "budget",
    "build",
    "continuation",
    "decoder_for",
    "replay",
    "strategy",
]

PROVIDERS: dict[str, tuple[Callable[..., HttpRequest], type[StreamDecoder]]] = {
    "openai": (_openai.build_request, _openai.OpenAIDecoder),
    "anthropic": (_anthropic.build_request, _anthropic.AnthropicDecoder),
    "openai-responses": (_responses.build_request, _responses.ResponsesDecoder),
}


def strategy(route: Route, memory: Memory, extra_body: dict[str, Any]) -> Strategy:
    """How a continuation on ``route`` is asked for, from what the process remembers."""
    assert route.base_url is not None
    if (route.base_url, route.model) in memory.prefill_refused:
        return "instruct"
    return choose(
        route.provider,
        route.base_url,
        route.continuation,
        extra_body,
        server_continues=route.base_url in memory.continues,
    )


def budget(opts: Options, route: Route) -> int | None:
    """The whole answer's token budget on ``route``."""
    if opts.max_tokens is None and route.provider == "anthropic":
        # The API requires max_tokens; the default bounds the whole answer, as it would
        # bound one uninterrupted stream.
        return _anthropic.DEFAULT_MAX_TOKENS
    return opts.max_tokens


def replay(opts: Options, route: Route, response_id: str, after: int) -> HttpRequest:
    """Re-attach to a background response that kept generating: exactly what was missed."""
    assert route.base_url is not None
    return _responses.replay_request(
        base_url=route.base_url,
        api_key=route.api_key,
        response_id=response_id,
        after=after,
        extra_headers=opts.headers,
    )


@dataclass(frozen=True, slots=True)
class Continuation:
    """What a continuation sends, and the de-duplicator its text goes through."""

    messages: list[dict[str, Any]]
    extra_body: dict[str, Any]
    dedup: Deduplicator


def continuation(
    opts: Options,
    route: Route,
    delivered: str,
    *,
    how: Strategy,
    thinking: list[dict[str, Any]],
    wording: int,
    hold: bool = True,
) -> Continuation:
    """The continuation of ``delivered`` on ``route`` (for ``instruct``, the route's token
    encoding is loaded: the delivered text's token seams are where a model may restart).
    ``hold``: an instruct request may leave the last token out where a repeat of it would
    otherwise be unprovable (:func:`~streamres._core.dedup.hold_back`)."""
    # Token seams of the delivered text's end: where a model may restart (CJK).
    starts = token_starts(route.model, delivered) if how == "instruct" else []
    withheld = hold_back(delivered, starts) if hold and how == "instruct" else 0
    cont = build_continuation(
        opts.messages,
        delivered[: len(delivered) - withheld],
        strategy=how,
        provider=route.provider,
        thinking=thinking,
        wording=wording,
    )
    dedup = Deduplicator(
        delivered,
        mode="instruct" if how == "instruct" else "prefill",
        stripped=cont.stripped,
        token_starts=starts,
        withheld=withheld,
    )
    return Continuation(cont.messages, {**opts.extra_body, **cont.extra_body}, dedup)


def build(
    opts: Options,
    route: Route,
    messages: list[dict[str, Any]],
    extra_body: dict[str, Any],
    max_tokens: int | None,
) -> HttpRequest:
    """The provider's request (``TypeError``/``ValueError``: it cannot be built)."""
    assert route.base_url is not None
    make, _ = PROVIDERS[route.provider]
    return make(
        base_url=route.base_url,
        api_key=route.api_key,
        model=route.model,
        messages=messages,
        max_tokens=max_tokens,
        extra_body=extra_body,
        extra_headers=opts.headers,
    )


def decoder_for(route: Route, opts: Options) -> StreamDecoder:
    """A fresh decoder of the route's provider's stream."""
    _, decoder_cls = PROVIDERS[route.provider]
    decoder = decoder_cls()
    if isinstance(decoder, _responses.ResponsesDecoder):
        decoder.custom_tools = _responses.custom_tool_names(opts.extra_body)
    return decoder
