"""The next request of an answer: the first, a continuation of what was delivered, or a
re-attachment to a background response. Pure.

A continuation resubmits the partial answer so the model continues it: by *prefill* (the
partial as a final assistant message, continued by the server) or by *instruct* (asked, in
words, to go on), chosen per route (``continuation.choose``) and remembered per server (a
server that refused a prefill is asked by instruct from then on; one that names itself as
continuing a final assistant message is resumed by prefill: ``Memory.strategy``). Its text
goes through a :class:`~streamres._core.dedup.Deduplicator` built here, which removes what the
model repeats.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from streamres._answer.actions import Load
from streamres._answer.attempt import Exchange
from streamres._answer.counting import Encodings
from streamres._answer.delivery import Delivery
from streamres._answer.memory import Memory
from streamres._answer.options import Options
from streamres._answer.reattach import Replay, Session
from streamres._answer.seam import Seam
from streamres._core.continuation import Strategy, build_continuation
from streamres._core.dedup import Deduplicator, hold_back
from streamres._core.redact import url_secrets
from streamres._core.sse import SSEDecoder
from streamres._core.stall import model_reasons
from streamres._core.tokens import token_starts
from streamres._fleet.routes import Route
from streamres._providers import anthropic as _anthropic
from streamres._providers import llama as _llama
from streamres._providers import openai as _openai
from streamres._providers import responses as _responses
from streamres._providers.params import for_route
from streamres._providers.wire import HttpRequest, StreamDecoder

__all__ = [
    "PROVIDERS",
    "Continuation",
    "Prepared",
    "budget",
    "build",
    "continuation",
    "decoder_for",
    "exchange",
    "prepare",
    "replay_request",
    "secrets",
    "stop_request",
]

PROVIDERS: dict[str, tuple[Callable[..., HttpRequest], type[StreamDecoder]]] = {
    "openai": (_openai.build_request, _openai.OpenAIDecoder),
    "anthropic": (_anthropic.build_request, _anthropic.AnthropicDecoder),
    "openai-responses": (_responses.build_request, _responses.ResponsesDecoder),
}


@dataclass(frozen=True, slots=True)
class Prepared:
    """The next request, and the de-duplicator a continuation's text goes through."""

    request: HttpRequest
    dedup: Deduplicator | None = None


def prepare(
    opts: Options,
    route: Route,
    *,
    replay: Replay | None,
    delivery: Delivery,
    memory: Memory,
    seam: Seam,
    encodings: Encodings,
    conversation: str = "",
) -> Prepared | Load | None:
    """The next request on ``route``: a re-attach to ``replay`` (the server kept generating:
    exactly what was missed), the first request, or a continuation of what was delivered
    (``conversation``: the id a Chat Completions request carries, for a server that keeps its
    stream). ``Load``: the route's token encoding first (an instruct continuation cuts at its
    token seams); ``None``: the token budget is spent, no request is made. ``TypeError`` or
    ``ValueError``: the request cannot be built."""
    if replay is not None:
        return Prepared(replay_request(opts, route, replay))
    max_tokens = budget(opts, route)
    messages, extra, dedup = opts.messages, opts.extra_body, None
    if delivery.chars:
        if max_tokens is not None:
            max_tokens -= delivery.server_tokens_or_count()
        how = memory.strategy(route, opts.extra_body)
        if how == "instruct" and encodings.get(route.model) is None:
            return encodings.ask(route.model)
        cont = continuation(
            opts,
            route,
            delivery.text,
            how=how,
            thinking=delivery.signed_thinking,
            wording=seam.wording,
            hold=seam.holds_back(route, memory),
        )
        messages, extra, dedup = cont.messages, cont.extra_body, cont.dedup
        if seam.no_tools and extra.get("tools"):
            extra = {**extra, "tool_choice": "none"}  # tools offered, none to be called
    if max_tokens is not None and max_tokens <= 0:
        return None
    req = build(opts, route, messages, extra, max_tokens)
    if conversation and route.provider == "openai":
        req.headers[_llama.CONVERSATION_HEADER] = conversation
    return Prepared(req, dedup)


def secrets(opts: Options, secret_header: Callable[[str], bool]) -> list[str]:
    """Every secret the answer's requests may carry: its credential headers' values, each
    route's API key and URL credentials (masked in every message, history entry and log)."""
    found: list[str | None] = [v for k, v in opts.headers.items() if secret_header(k)]
    for i in opts.chain:
        route = opts.fleet.routes[i]
        found += [route.api_key, *url_secrets(route.base_url or "")]
    return [s for s in found if s]


def exchange(
    opts: Options,
    route: Route,
    req: HttpRequest,
    dedup: Deduplicator | None,
    replay: Replay | None = None,
) -> Exchange:
    """The exchange of ``req``: what will read its response on ``route`` — for a llama.cpp
    re-attach, the broken attempt's own decoders, reading on from the byte it reached."""
    conversation = req.headers.get(_llama.CONVERSATION_HEADER, "")
    if replay is not None and replay.session is not None:
        assert replay.sse is not None
        assert replay.decoder is not None
        return Exchange(
            req,
            replay.decoder,
            None,
            replay.sse,
            conversation=replay.session.conversation,
            received=replay.after,
        )
    sse = SSEDecoder(max_line=opts.read_limits.line, max_event=opts.read_limits.event)
    return Exchange(req, decoder_for(route, opts), dedup, sse, conversation=conversation)


def budget(opts: Options, route: Route) -> int | None:
    """The whole answer's token budget on ``route``."""
    if opts.max_tokens is None and route.provider == "anthropic":
        # The API requires max_tokens; the default bounds the whole answer, as it would
        # bound one uninterrupted stream.
        return _anthropic.DEFAULT_MAX_TOKENS
    return opts.max_tokens


def replay_request(opts: Options, route: Route, replay: Replay) -> HttpRequest:
    """Re-attach to a response the server kept generating: exactly what was missed."""
    assert route.base_url is not None
    if replay.session is not None:
        return _llama.replay_request(
            base_url=route.base_url,
            api_key=route.api_key,
            conversation=replay.session.conversation,
            start=replay.after,
            extra_headers=opts.headers,
        )
    return _responses.replay_request(
        base_url=route.base_url,
        api_key=route.api_key,
        response_id=replay.response_id,
        after=replay.after,
        extra_headers=opts.headers,
    )


def stop_request(opts: Options, route: Route, session: Session) -> HttpRequest:
    """Stop a llama.cpp generation nobody will read (``DELETE /v1/stream``)."""
    assert route.base_url is not None
    return _llama.stop_request(
        base_url=route.base_url,
        api_key=route.api_key,
        conversation=session.conversation,
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
        own_instruction=opts.continue_instruction or route.continue_instruction,
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
    reasons = model_reasons(route.model, route.thinks)
    extra_body, _ = for_route(route.provider, extra_body, reasons=reasons)
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
