"""Request parameters written once, for every provider. Pure.

A caller (the proxy's clients too) writes a request's other parameters in any of the three
APIs' names; each provider gets them in its own, so a model chain may mix providers without a
parameter going missing. What becomes of each field on each API is :mod:`.fields`' tables: a
parameter another provider has under another name is converted here; one that asks nothing of
the answer there is left out (and said: :func:`for_route` returns why); one it has no
equivalent for is refused before any request is sent (``ValueError`` naming it); one no API
defines passes as it is (the upstream judges it)::

    OpenAI Chat               Anthropic Messages           Responses API
    stop                      stop_sequences               (none: refused)
    reasoning_effort          output_config.effort *       reasoning.effort
    response_format           output_config.format         text.format (json_schema flattened)
    verbosity                 (none: refused)              text.verbosity
    user                      metadata.user_id             user
    parallel_tool_calls=false tool_choice.disable_parallel_tool_use  parallel_tool_calls
    thinking (Anthropic) → reasoning_effort by its budget (adaptive: by output_config.effort)
    output_config.effort → reasoning_effort / reasoning.effort; .format → response_format

(*) Effort goes only to a route whose model reasons (``reasons``: the route's ``thinks``, else
its name): a model that does not reason refuses the field, so there it is left out and said.
Tools: ``namespace`` tools (a named group of functions, Codex's) become their functions, each
named ``<namespace>__<name>`` (:func:`~streamres._providers.tools.flat_name`), on every route; a
hosted tool (web search, file search, code interpreter, MCP…) goes only to a route whose API
runs it, and is left out (and said) elsewhere.

Sampling parameters with one name everywhere (``temperature``, ``top_p``) pass as they are. A
Responses ``reasoning.summary`` asks only for a summary of the reasoning to be returned; Chat
Completions returns none, so there it is left out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from streamres._providers.fields import fate
from streamres._providers.tools import flat_tools, hosts

__all__ = ["Left", "for_provider", "for_route"]

#: A field (or a tool) left out for a route, and why.
Left = tuple[str, str]

#: Efforts between the APIs: OpenAI's (none, minimal, low, medium, high, xhigh) and
#: Anthropic's (low, medium, high, max).
_TO_ANTHROPIC = {"minimal": "low", "low": "low", "medium": "medium", "high": "high"}
_TO_ANTHROPIC |= {"xhigh": "max"}
_TO_OPENAI = {"low": "low", "medium": "medium", "high": "high", "max": "xhigh"}


def _effort(thinking: Any, config: Any = None) -> str | None:
    """An Anthropic ``thinking`` setting (and ``output_config``) as an OpenAI effort
    (``None``: no effort asked: thinking off, or adaptive with no effort given)."""
    given = config.get("effort") if isinstance(config, Mapping) else None
    if isinstance(given, str):
        return _TO_OPENAI.get(given, given)
    if not isinstance(thinking, Mapping) or thinking.get("type") != "enabled":
        return None
    budget = thinking.get("budget_tokens")
    budget = budget if isinstance(budget, int) else 4096
    return "low" if budget < 2048 else "medium" if budget < 8192 else "high"


def _chat_format(fmt: Any) -> Any:
    """A Responses ``text.format`` or an Anthropic ``output_config.format`` as Chat's
    ``response_format`` (json_schema nests there, and needs a name)."""
    if isinstance(fmt, Mapping) and fmt.get("type") == "json_schema" and "json_schema" not in fmt:
        inner = {k: v for k, v in fmt.items() if k != "type"}
        inner.setdefault("name", "output")
        return {"type": "json_schema", "json_schema": inner}
    return fmt


def _responses_format(fmt: Any) -> Any:
    """Chat's ``response_format`` as a Responses ``text.format`` (json_schema is flat there)."""
    if isinstance(fmt, Mapping) and isinstance(fmt.get("json_schema"), Mapping):
        return {"type": "json_schema", **fmt["json_schema"]}
    if isinstance(fmt, Mapping) and fmt.get("type") == "json_schema" and "name" not in fmt:
        return {**fmt, "name": "output"}
    return fmt


def _anthropic_format(fmt: Any, name: str) -> Any:
    """Chat's ``response_format`` or a Responses ``text.format`` as Anthropic's
    ``output_config.format``: a JSON schema (``ValueError`` for JSON without one)."""
    if not isinstance(fmt, Mapping) or fmt.get("type") == "text":
        return None
    nested = fmt.get("json_schema")
    inner: Mapping[str, Any] = nested if isinstance(nested, Mapping) else fmt
    if fmt.get("type") != "json_schema" or not isinstance(inner.get("schema"), Mapping):
        raise ValueError(
            f"{name} cannot be sent to this model: Anthropic's API takes a JSON schema "
            f"(output_config.format), not {fmt.get('type')!s:.30} output"
        )
    return {"type": "json_schema", "schema": inner["schema"]}


#: Values that ask for nothing (each API's default): left out where the parameter is unknown,
#: rather than refused (clients send some of them always).
_DEFAULTS: dict[str, Any] = {
    "n": 1,
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "logprobs": False,
    "logit_bias": {},
    "parallel_tool_calls": True,
    "truncation": "disabled",
    "top_logprobs": 0,
}


def for_provider(provider: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` in ``provider``'s names; ``ValueError`` for one it has no equivalent for.

    >>> for_provider("anthropic", {"stop": "END", "temperature": 0})
    {'temperature': 0, 'stop_sequences': ['END']}
    """
    return for_route(provider, params)[0]


def for_route(
    provider: str, params: Mapping[str, Any], *, reasons: bool = True
) -> tuple[dict[str, Any], list[Left]]:
    """``params`` as a route of ``provider`` takes them, and what was left out for it, with
    why; ``reasons``: the route's model reasons (an effort goes to it). ``ValueError`` names a
    field the route cannot honour."""
    out = dict(params)
    left: list[Left] = []
    for name, default in _DEFAULTS.items():
        if name in out and out[name] == default and type(out[name]) is type(default):
            f = fate(name, provider)
            if f is not None and f.kind != "same":  # another API's default: asks nothing
                del out[name]
    _efforts(provider, out, left, reasons=reasons)
    _shared_names(provider, out, left)
    if provider == "anthropic":
        if "stop" in out and "stop_sequences" not in out:
            stop = out.pop("stop")
            out["stop_sequences"] = [stop] if isinstance(stop, str) else stop
        for name in ("user", "safety_identifier"):
            if name in out:
                user = out.pop(name)
                metadata = dict(out.get("metadata") or {})
                metadata.setdefault("user_id", user)
                out["metadata"] = metadata
        fmt = out.pop("response_format", None)
        text = out.pop("text", None)
        if isinstance(text, Mapping):
            if text.get("verbosity") is not None:
                out["verbosity"] = text["verbosity"]  # refused below, by its name
            fmt = text.get("format", fmt)
        if fmt is not None and (converted := _anthropic_format(fmt, "response_format")):
            config = dict(out.get("output_config") or {})
            config.setdefault("format", converted)
            out["output_config"] = config
    elif provider == "openai":
        if "stop_sequences" in out and "stop" not in out:
            out["stop"] = out.pop("stop_sequences")
        config = out.pop("output_config", None)
        if isinstance(config, Mapping) and config.get("format") is not None:
            out.setdefault("response_format", _chat_format(config["format"]))
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
        config = out.pop("output_config", None)
        if isinstance(config, Mapping) and config.get("format") is not None:
            text.setdefault("format", _responses_format(config["format"]))
        if "verbosity" in out:
            text.setdefault("verbosity", out.pop("verbosity"))
        if text:
            out["text"] = text
    if isinstance(out.get("tools"), Sequence) and not isinstance(out["tools"], str):
        out["tools"] = _tools(provider, out["tools"], left)
        if not out["tools"]:
            del out["tools"]
            out.pop("tool_choice", None)
    for name in list(out):
        f = fate(name, provider)
        if f is None or f.kind in ("same", "to", "read"):
            continue
        value = out.pop(name)
        if f.kind == "out":
            left.append((name, f.text))
        elif value is not None and value is not False:  # asks for nothing: left out
            raise ValueError(f"{name} cannot be sent to this model: {f.text}")
    return out, left


def _efforts(provider: str, out: dict[str, Any], left: list[Left], *, reasons: bool) -> None:
    """The effort asked for in another API's names, in ``provider``'s — for a model that
    reasons; for one that does not, left out and said (it would refuse the field). The route's
    own API's fields pass as they are."""
    asked: Any = None
    source = ""
    if provider != "anthropic" and ("thinking" in out or "output_config" in out):
        thinking, config = out.pop("thinking", None), out.pop("output_config", None)
        asked = _effort(thinking, config)
        source = "output_config.effort" if isinstance(config, Mapping) else "thinking"
        rest = {k: v for k, v in config.items() if k != "effort"} if config else {}
        if rest:
            out["output_config"] = rest  # its format: converted below
    if provider != "openai" and "reasoning_effort" in out:
        asked, source = out.pop("reasoning_effort"), "reasoning_effort"
    if provider != "openai-responses" and isinstance(out.get("reasoning"), Mapping):
        reasoning = out.pop("reasoning")
        if reasoning.get("summary") is not None:
            left.append(("reasoning.summary", "only the Responses API returns a summary"))
        if reasoning.get("effort") is not None:
            asked, source = reasoning["effort"], "reasoning.effort"
    if asked is None:
        return
    if not reasons:
        left.append(
            (source, "the route's model does not reason (a route's thinks = true says it does)")
        )
    elif provider == "openai":
        out.setdefault("reasoning_effort", asked)
    elif provider == "openai-responses":
        settings = dict(out.get("reasoning") or {})
        settings.setdefault("effort", asked)
        out["reasoning"] = settings
    elif asked != "none":
        settings = dict(out.get("output_config") or {})
        settings.setdefault("effort", _TO_ANTHROPIC.get(str(asked), asked))
        out["output_config"] = settings
        out.setdefault("thinking", {"type": "adaptive"})


def _shared_names(provider: str, out: dict[str, Any], left: list[Left]) -> None:
    """Two names all three APIs define, each in its own way, told apart by their values:
    ``metadata`` (Anthropic's holds only ``user_id``, an end-user tag; the others' are a
    stored answer's tags) and ``service_tier`` (the tiers are named per API)."""
    metadata = out.get("metadata")
    if isinstance(metadata, Mapping) and metadata:
        anthropic = set(metadata) <= {"user_id"}
        if provider == "anthropic" and not anthropic:
            out["metadata"] = {k: v for k, v in metadata.items() if k == "user_id"}
            left.append(("metadata", "tags for a stored answer; Anthropic's holds only user_id"))
        elif provider != "anthropic" and anthropic:
            del out["metadata"]
            left.append(("metadata", "Anthropic's end-user tag (metadata.user_id)"))
        if not out.get("metadata", True):
            del out["metadata"]
    tier = out.get("service_tier")
    foreign = (provider == "anthropic") != (tier == "standard_only")
    if isinstance(tier, str) and tier != "auto" and foreign:
        del out["service_tier"]
        left.append(("service_tier", f"{tier!r:.20} is another API's tier"))


def _tools(provider: str, tools: Sequence[Any], left: list[Left]) -> list[Any]:
    """``tools`` for a route of ``provider``: namespaces flattened, hosted tools of another
    API left out (said)."""
    kept = []
    for tool in flat_tools(tools):
        apis = hosts(tool)
        if apis is not None and provider not in apis:
            kind = str(tool.get("type"))
            named = "" if kind == tool.get("name") or "name" not in tool else f" {tool['name']}"
            left.append((f"tools: {kind}{named}", _HOSTED_ELSEWHERE))
        else:
            kept.append(tool)
    return kept


_HOSTED_ELSEWHERE = (
    "a tool another API runs itself (or takes in its own shape); this route's API does not"
)
