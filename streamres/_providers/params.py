"""Request parameters written once, for every provider. Pure.

A caller (the proxy's clients too) writes a request's other parameters in any of the three
APIs' names; each provider gets them in its own, so a model chain may mix providers without a
parameter going missing. A parameter another provider has under another name is converted; one
it has no equivalent for, or one this table does not convert, is refused before any request is
sent (``ValueError`` naming it), never dropped; one this table does not know passes as it is
(the upstream judges it)::

    OpenAI Chat               Anthropic Messages           Responses API
    stop                      stop_sequences               (none: refused)
    reasoning_effort          (refused: not converted)     reasoning.effort
    response_format           (refused: not converted)     text.format (json_schema flattened)
    verbosity                 (none: refused)              text.verbosity
    user                      metadata.user_id             user
    parallel_tool_calls=false tool_choice.disable_parallel_tool_use  parallel_tool_calls
    thinking (Anthropic) → reasoning_effort by its budget where there is no thinking

Sampling parameters with one name everywhere (``temperature``, ``top_p``) pass as they are. A
Responses ``reasoning.summary`` asks only for a summary of the reasoning to be returned; Chat
Completions returns none, so there it is left out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["for_provider"]

#: Parameters a provider has no equivalent for, or that are not converted for it (so they are
#: refused there), with what to do.
_NONE: dict[str, dict[str, str]] = {
    "anthropic": {
        "seed": "Anthropic's API has no seed",
        "presence_penalty": "Anthropic's API has no presence penalty",
        "frequency_penalty": "Anthropic's API has no frequency penalty",
        "logit_bias": "Anthropic's API has no logit bias",
        "logprobs": "Anthropic's API returns no log probabilities",
        "top_logprobs": "Anthropic's API returns no log probabilities",
        "response_format": "it is not converted for Anthropic routes; give them "
        "output_config={'format': …} in Anthropic's own shape",
        "text": "text.format is not converted for Anthropic routes; give them "
        "output_config={'format': …} in Anthropic's own shape",
        "reasoning_effort": "it is not converted for Anthropic routes; give them "
        "output_config={'effort': …} or thinking={…} in Anthropic's own shape",
        "reasoning": "it is not converted for Anthropic routes; give them "
        "output_config={'effort': …} or thinking={…} in Anthropic's own shape",
        "verbosity": "Anthropic's API has no verbosity",
        "background": "background responses are the Responses API's",
        "n": "streamres streams one answer per call",
        "store": "Anthropic's API keeps no responses to fetch later",
        "modalities": "Anthropic's API answers in text",
        "audio": "Anthropic's API answers in text",
        "prediction": "Anthropic's API takes no predicted output",
        "web_search_options": "give Anthropic's web search tool instead",
    },
    "openai": {
        "background": "background responses are the Responses API's",
        "truncation": "truncation is the Responses API's",
    },
    "openai-responses": {
        "stop": "the Responses API has no stop sequences",
        "stop_sequences": "the Responses API has no stop sequences",
        "seed": "the Responses API has no seed",
        "presence_penalty": "the Responses API has no presence penalty",
        "frequency_penalty": "the Responses API has no frequency penalty",
        "logit_bias": "the Responses API has no logit bias",
        "top_k": "the Responses API has no top_k",
        "logprobs": "the Responses API asks for log probabilities with include=",
    },
}


def _effort(thinking: Any) -> str | None:
    """An Anthropic ``thinking`` setting as an OpenAI effort (``None``: thinking off)."""
    if not isinstance(thinking, Mapping) or thinking.get("type") != "enabled":
        return None
    budget = thinking.get("budget_tokens")
    budget = budget if isinstance(budget, int) else 4096
    return "low" if budget < 2048 else "medium" if budget < 8192 else "high"


def _chat_format(fmt: Any) -> Any:
    """A Responses ``text.format`` as Chat's ``response_format`` (json_schema nests there)."""
    if isinstance(fmt, Mapping) and fmt.get("type") == "json_schema" and "json_schema" not in fmt:
        inner = {k: v for k, v in fmt.items() if k != "type"}
        return {"type": "json_schema", "json_schema": inner}
    return fmt


def _responses_format(fmt: Any) -> Any:
    """Chat's ``response_format`` as a Responses ``text.format`` (json_schema is flat there)."""
    if isinstance(fmt, Mapping) and isinstance(fmt.get("json_schema"), Mapping):
        return {"type": "json_schema", **fmt["json_schema"]}
    return fmt


#: Values that ask for nothing (each API's default): left out where the parameter is unknown,
#: rather than refused (clients send some of them always).
_DEFAULTS: dict[str, Any] = {
    "n": 1,
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "logprobs": False,
    "logit_bias": {},
    "parallel_tool_calls": True,
}


def for_provider(provider: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` in ``provider``'s names; ``ValueError`` for one it has no equivalent for.

    >>> for_provider("anthropic", {"stop": "END", "temperature": 0})
    {'temperature': 0, 'stop_sequences': ['END']}
    """
    out = dict(params)
    if provider != "openai":
        for name, default in _DEFAULTS.items():
            if name in out and out[name] == default and type(out[name]) is type(default):
                del out[name]
    if provider == "anthropic":
        if "stop" in out and "stop_sequences" not in out:
            stop = out.pop("stop")
            out["stop_sequences"] = [stop] if isinstance(stop, str) else stop
        if "user" in out:
            user = out.pop("user")
            metadata = dict(out.get("metadata") or {})
            metadata.setdefault("user_id", user)
            out["metadata"] = metadata
    elif provider == "openai":
        if "stop_sequences" in out and "stop" not in out:
            out["stop"] = out.pop("stop_sequences")
        if "thinking" in out:
            effort = _effort(out.pop("thinking"))
            if effort is not None:
                out.setdefault("reasoning_effort", effort)
        if isinstance(out.get("reasoning"), Mapping):
            reasoning = out.pop("reasoning")
            if reasoning.get("effort") is not None:
                out.setdefault("reasoning_effort", reasoning["effort"])
        if isinstance(out.get("text"), Mapping):
            text = dict(out.pop("text"))
            if "format" in text:
                out.setdefault("response_format", _chat_format(text.pop("format")))
            if "verbosity" in text:
                out.setdefault("verbosity", text.pop("verbosity"))
            if text:
                raise ValueError(f"text.{sorted(text)[0]} has no Chat Completions equivalent")
    elif provider == "openai-responses":
        text = dict(out.pop("text")) if isinstance(out.get("text"), Mapping) else {}
        if "response_format" in out:
            text.setdefault("format", _responses_format(out.pop("response_format")))
        if "verbosity" in out:
            text.setdefault("verbosity", out.pop("verbosity"))
        if text:
            out["text"] = text
        reasoning = dict(out.pop("reasoning")) if isinstance(out.get("reasoning"), Mapping) else {}
        if "reasoning_effort" in out:
            reasoning.setdefault("effort", out.pop("reasoning_effort"))
        if "thinking" in out:
            effort = _effort(out.pop("thinking"))
            if effort is not None:
                reasoning.setdefault("effort", effort)
        if reasoning:
            out["reasoning"] = reasoning
    refused = _NONE.get(provider, {})
    for name in [n for n in out if n in refused]:
        if out[name] is None or out[name] is False:
            del out[name]  # asks for nothing this provider would have to honour
        else:
            raise ValueError(f"{name} cannot be sent to this model: {refused[name]}")
    return out
