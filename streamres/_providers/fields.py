"""Every field of the three APIs, and what becomes of it on a route of each API. Pure.

One table per API — Chat Completions (:data:`CHAT`), Anthropic's Messages (:data:`MESSAGES`),
the Responses API (:data:`RESPONSES`) — lists the fields that API defines and, for each, its
fate on a route that speaks one of the other two:

- **same**: the other API defines it too, under the same name: it passes as it is;
- **to** *x*: translated into the other API's *x* (:mod:`.params` does it);
- **out**: left out, with the reason — a field that asks nothing of the answer there (client
  bookkeeping, caching hints, a hosted tool's options), which a client sends on every request
  and which must not cost it its answer; the proxy's log says which and why;
- **no**: refused before any request, naming the field and the route: it would change the
  answer, and the route cannot honour it.

A field on a route of its own API passes. A field that no table knows (a server's extension:
llama.cpp's ``min_p``, vLLM's ``repetition_penalty``) passes as it is, and that server judges
it. The proxy's documentation carries the tables, rendered by :func:`markdown`.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

__all__ = [
    "APIS",
    "CHAT",
    "MESSAGES",
    "RESPONSES",
    "Fate",
    "check",
    "fate",
    "markdown",
]

Provider = Literal["openai", "anthropic", "openai-responses"]
APIS: tuple[Provider, ...] = ("openai", "anthropic", "openai-responses")
_NAMES = {"openai": "Chat Completions", "anthropic": "Messages", "openai-responses": "Responses"}


class Fate(NamedTuple):
    kind: Literal["same", "to", "out", "no", "read"]
    #: ``to``: what it becomes; ``out`` and ``no``: why.
    text: str = ""


SAME = Fate("same")
#: Read by streamres itself (the conversation, the model, the token budget, streaming).
READ = Fate("read", "read by streamres and sent in each API's own name")


def to(what: str) -> Fate:
    return Fate("to", what)


def out(why: str) -> Fate:
    return Fate("out", why)


def no(why: str) -> Fate:
    return Fate("no", why)


def on(targets: tuple[Provider, Provider], fate: Fate) -> dict[Provider, Fate]:
    """The same fate on both other APIs' routes."""
    return dict.fromkeys(targets, fate)


_NOT_CHAT: tuple[Provider, Provider] = ("anthropic", "openai-responses")
_NOT_MESSAGES: tuple[Provider, Provider] = ("openai", "openai-responses")
_NOT_RESPONSES: tuple[Provider, Provider] = ("openai", "anthropic")


_HOSTED = "a hosted tool's option: the route's API runs no such tool (the proxy's [tools] hosted)"
_CACHE = "a caching hint of another API's; this API caches on its own terms"
_TIER = "service tiers are named per API"
_MEDIA = "this API answers in text"
_TOOLS = "its shape (functions; a hosted tool only where the API runs it)"

#: Chat Completions' fields: their fate on a Messages route and on a Responses route.
CHAT: dict[str, dict[Provider, Fate]] = {
    "model": on(_NOT_CHAT, READ),
    "messages": on(_NOT_CHAT, READ),
    "stream": on(_NOT_CHAT, READ),
    "stream_options": on(_NOT_CHAT, READ),
    "max_tokens": on(_NOT_CHAT, READ),
    "max_completion_tokens": on(_NOT_CHAT, READ),
    "temperature": on(_NOT_CHAT, SAME),
    "top_p": on(_NOT_CHAT, SAME),
    "tools": on(_NOT_CHAT, to(_TOOLS)),
    "tool_choice": on(_NOT_CHAT, to("its shape")),
    "parallel_tool_calls": {
        "anthropic": to("tool_choice.disable_parallel_tool_use"),
        "openai-responses": SAME,
    },
    "stop": {
        "anthropic": to("stop_sequences"),
        "openai-responses": no("the Responses API has no stop sequences"),
    },
    "reasoning_effort": {
        "anthropic": to("output_config.effort (and thinking adaptive) on a route that thinks"),
        "openai-responses": to("reasoning.effort"),
    },
    "response_format": {
        "anthropic": to("output_config.format (a JSON schema; json_object is refused)"),
        "openai-responses": to("text.format"),
    },
    "verbosity": {
        "anthropic": no("Anthropic's API has no verbosity"),
        "openai-responses": to("text.verbosity"),
    },
    "user": {"anthropic": to("metadata.user_id"), "openai-responses": SAME},
    "safety_identifier": {"anthropic": to("metadata.user_id"), "openai-responses": SAME},
    "seed": {
        "anthropic": no("Anthropic's API has no seed"),
        "openai-responses": no("the Responses API has no seed"),
    },
    "presence_penalty": {
        "anthropic": no("Anthropic's API has no presence penalty"),
        "openai-responses": no("the Responses API has no presence penalty"),
    },
    "frequency_penalty": {
        "anthropic": no("Anthropic's API has no frequency penalty"),
        "openai-responses": no("the Responses API has no frequency penalty"),
    },
    "logit_bias": {
        "anthropic": no("Anthropic's API has no logit bias"),
        "openai-responses": no("the Responses API has no logit bias"),
    },
    "logprobs": {
        "anthropic": no("Anthropic's API returns no log probabilities"),
        "openai-responses": no("the Responses API asks for log probabilities with include="),
    },
    "top_logprobs": {
        "anthropic": no("Anthropic's API returns no log probabilities"),
        "openai-responses": SAME,
    },
    "n": on(_NOT_CHAT, no("streamres streams one answer per call")),
    "modalities": on(_NOT_CHAT, no(_MEDIA)),
    "audio": on(_NOT_CHAT, no(_MEDIA)),
    "prediction": {
        "anthropic": no("Anthropic's API takes no predicted output"),
        "openai-responses": no("the Responses API takes no predicted output"),
    },
    "functions": on(_NOT_CHAT, no("the old way of giving tools: write them as tools=")),
    "function_call": on(_NOT_CHAT, no("the old way of choosing a tool: write it as tool_choice=")),
    "store": {
        "anthropic": no("Anthropic's API keeps no completions to fetch later"),
        "openai-responses": SAME,
    },
    "metadata": {
        "anthropic": out("tags for a stored completion; Anthropic's metadata holds only user_id"),
        "openai-responses": SAME,
    },
    "prompt_cache_key": {"anthropic": out(_CACHE), "openai-responses": SAME},
    "prompt_cache_retention": {"anthropic": out(_CACHE), "openai-responses": SAME},
    "service_tier": {"anthropic": out(_TIER), "openai-responses": SAME},
    "web_search_options": {"anthropic": out(_HOSTED), "openai-responses": out(_HOSTED)},
}

#: Anthropic Messages' fields: their fate on a Chat Completions route and on a Responses route.
MESSAGES: dict[str, dict[Provider, Fate]] = {
    "model": on(_NOT_MESSAGES, READ),
    "messages": on(_NOT_MESSAGES, READ),
    "system": on(_NOT_MESSAGES, READ),
    "stream": on(_NOT_MESSAGES, READ),
    "max_tokens": on(_NOT_MESSAGES, READ),
    "temperature": on(_NOT_MESSAGES, SAME),
    "top_p": on(_NOT_MESSAGES, SAME),
    "top_k": {
        "openai": Fate("same", "llama.cpp, vLLM and SGLang take it; OpenAI itself does not"),
        "openai-responses": no("the Responses API has no top_k"),
    },
    "tools": on(_NOT_MESSAGES, to(_TOOLS)),
    "tool_choice": on(_NOT_MESSAGES, to("its shape")),
    "stop_sequences": {
        "openai": to("stop"),
        "openai-responses": no("the Responses API has no stop sequences"),
    },
    "thinking": {
        "openai": to("reasoning_effort (by budget; adaptive: by output_config.effort)"),
        "openai-responses": to("reasoning.effort"),
    },
    "output_config": {
        "openai": to("reasoning_effort (effort), response_format (format)"),
        "openai-responses": to("reasoning.effort (effort), text.format (format)"),
    },
    "metadata": on(_NOT_MESSAGES, out("Anthropic's metadata.user_id is its own end-user tag")),
    "context_management": {
        "openai": out(
            "it clears old tool results and thinking in Anthropic's context; other "
            "APIs get the conversation as it was sent"
        ),
        "openai-responses": out(
            "it clears old tool results and thinking in Anthropic's "
            "context; other APIs get the conversation as it was sent"
        ),
    },
    "service_tier": on(_NOT_MESSAGES, out(_TIER)),
    "inference_geo": on(
        _NOT_MESSAGES, out("where Anthropic runs the model; not another API's to choose")
    ),
    "container": on(_NOT_MESSAGES, out(_HOSTED)),
    "mcp_servers": {"openai": out(_HOSTED), "openai-responses": out(_HOSTED)},
}

#: The Responses API's fields: their fate on a Chat Completions route and on a Messages route.
RESPONSES: dict[str, dict[Provider, Fate]] = {
    "model": on(_NOT_RESPONSES, READ),
    "input": on(_NOT_RESPONSES, READ),
    "instructions": on(_NOT_RESPONSES, READ),
    "stream": on(_NOT_RESPONSES, READ),
    "max_output_tokens": on(_NOT_RESPONSES, READ),
    "previous_response_id": on(_NOT_RESPONSES, READ),
    "background": on(
        _NOT_RESPONSES, no("background responses are the Responses API's (the proxy runs them)")
    ),
    "temperature": on(_NOT_RESPONSES, SAME),
    "top_p": on(_NOT_RESPONSES, SAME),
    "tools": on(_NOT_RESPONSES, to(_TOOLS)),
    "tool_choice": on(_NOT_RESPONSES, to("its shape")),
    "parallel_tool_calls": {
        "openai": SAME,
        "anthropic": to("tool_choice.disable_parallel_tool_use"),
    },
    "reasoning": {
        "openai": to("reasoning_effort (effort; a summary is left out: Chat returns none)"),
        "anthropic": to("output_config.effort (and thinking adaptive) on a route that thinks"),
    },
    "text": {
        "openai": to("response_format (format), verbosity"),
        "anthropic": to("output_config.format (format; verbosity is refused)"),
    },
    "user": {"openai": SAME, "anthropic": to("metadata.user_id")},
    "safety_identifier": {"openai": SAME, "anthropic": to("metadata.user_id")},
    "top_logprobs": {
        "openai": SAME,
        "anthropic": no("Anthropic's API returns no log probabilities"),
    },
    "truncation": on(
        _NOT_RESPONSES, no('truncation is the Responses API\'s ("disabled" is left out)')
    ),
    "store": {
        "openai": SAME,
        "anthropic": no("Anthropic's API keeps no responses to fetch later"),
    },
    "include": on(
        _NOT_RESPONSES,
        out(
            "it asks for output items (encrypted reasoning, sources, log "
            "probabilities) only the Responses API returns"
        ),
    ),
    "max_tool_calls": on(
        _NOT_RESPONSES, out("a bound on hosted tool calls, which this API does not run")
    ),
    "metadata": {
        "openai": out("tags for a stored response; Chat's need store=true"),
        "anthropic": out("tags for a stored response; Anthropic's metadata holds only user_id"),
    },
    "client_metadata": on(_NOT_RESPONSES, out("a client's own bookkeeping (Codex sends it)")),
    "prompt_cache_key": {"openai": SAME, "anthropic": out(_CACHE)},
    "prompt_cache_retention": {"openai": SAME, "anthropic": out(_CACHE)},
    "service_tier": {"openai": SAME, "anthropic": out(_TIER)},
    "conversation": on(_NOT_RESPONSES, no("state kept by one server: send the whole conversation")),
    "prompt": {
        "openai": no("a prompt kept by one server: send its text as input"),
        "anthropic": no("a prompt kept by one server: send its text as input"),
    },
}

_TABLES: dict[Provider, dict[str, dict[Provider, Fate]]] = {
    "openai": CHAT,
    "anthropic": MESSAGES,
    "openai-responses": RESPONSES,
}


def fate(name: str, provider: str) -> Fate | None:
    """What becomes of the field ``name`` on a route of ``provider``'s API: ``same`` when
    that API defines it; else its fate in the table of the first API that defines it; ``None``
    when no API does (an extension: it passes as it is)."""
    target: Provider = provider if provider in ("anthropic", "openai-responses") else "openai"  # type: ignore[assignment]
    if name in _TABLES[target]:
        return SAME
    for api in APIS:
        entry = _TABLES[api].get(name)
        if entry is not None:
            return entry.get(target, SAME)
    return None


def markdown() -> str:
    """The three tables as the documentation shows them."""
    lines: list[str] = []
    for api in APIS:
        others = [o for o in APIS if o != api]
        table = _TABLES[api]
        read = [f"`{name}`" for name, fates in table.items() if fates[others[0]].kind == "read"]
        lines += [
            f"**{_NAMES[api]}.** Read by streamres itself and sent in each API's own name: "
            + ", ".join(read)
            + ".",
            "",
            f"{_NAMES[api]} field | on a {_NAMES[others[0]]} route | "
            f"on a {_NAMES[others[1]]} route",
            "|".join(["---"] * 3),
        ]
        for name, fates in table.items():
            if fates[others[0]].kind == "read":
                continue
            cells = []
            for other in others:
                f = fates.get(other, SAME)
                if f.kind == "to":
                    cells.append(f"→ {f.text}")
                elif f.kind == "out":
                    cells.append(f"left out: {f.text}")
                elif f.kind == "no":
                    cells.append(f"refused: {f.text}")
                else:
                    cells.append("as is" + (f" ({f.text})" if f.text else ""))
            lines.append(f"`{name}` | " + " | ".join(cells))
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def check() -> None:
    """Every entry names only the other APIs (a test holds the tables to it)."""
    for api, table in _TABLES.items():
        for name, fates in table.items():
            if api in fates or set(fates) - set(APIS):
                raise ValueError(f"{api}'s {name}: its fates name {sorted(fates)}")
