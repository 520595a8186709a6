"""Tools written once, for every provider. Pure.

A caller writes ``tools`` and ``tool_choice`` in the OpenAI Chat Completions function format,
and tool calls and their results in the message history the OpenAI way (an assistant message
with ``tool_calls``, then ``role: "tool"`` messages). Each provider gets them in its own shape,
so that a ``Client`` whose routes mix providers can fall back from an OpenAI model to a Claude
model (or back) in the middle of a tool-using answer::

    OpenAI function tool                      Anthropic                 Responses API
    {"type": "function", "function":          {"name", "description",   {"type": "function",
      {"name", "description", "parameters"}}    "input_schema"}           "name", "description",
                                                                          "parameters"}
    tool_choice "auto" | "none" | "required"  {"type": "auto"|"none"|"any"}    as given
    {"type": "function", "function": {name}}  {"type": "tool", "name"}  {"type": "function", name}
    assistant {"tool_calls": [...]}           tool_use blocks           function_call items
    {"role": "tool", "tool_call_id", ...}     a user turn of            function_call_output
                                              tool_result blocks        items

A provider's own format is still accepted: anything already in the target shape passes as it
is, and the other two shapes are read too (so tools written for Claude reach an OpenAI model).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from streamres._providers.parts import content_for

__all__ = [
    "NAMESPACE_JOIN",
    "anthropic_messages",
    "anthropic_tools",
    "calls_already_run",
    "canonical_tool",
    "flat_name",
    "flat_tools",
    "hosts",
    "is_call_already_run",
    "openai_tools",
    "responses_input",
    "responses_tools",
]


def canonical_tool(tool: Any) -> Any:
    """Any of the three shapes -> the OpenAI function shape (other tools pass unchanged)."""
    if not isinstance(tool, Mapping):
        return tool
    if isinstance(tool.get("function"), Mapping):
        return dict(tool)
    if "input_schema" in tool and "name" in tool:  # Anthropic
        fn = {"name": tool["name"], "parameters": tool["input_schema"]}
        if tool.get("description"):
            fn["description"] = tool["description"]
        return {"type": "function", "function": fn}
    if tool.get("type") == "function" and "name" in tool:  # Responses API
        fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
        return {"type": "function", "function": fn}
    return dict(tool)  # a provider's own built-in tool (web search…): as given


#: How a ``namespace`` tool's function is named once the group is flattened.
NAMESPACE_JOIN = "__"

#: Tools an API runs itself (hosted, or with a schema of its own), by their ``type``.
_RESPONSES_HOSTED = re.compile(
    r"^(web_search\w*|file_search|code_interpreter|computer\w*|image_generation|mcp|"
    r"local_shell|shell|apply_patch|tool_search)$"
)
_ANTHROPIC_HOSTED = re.compile(r"^(\w+_\d{8}|mcp_toolset)$")


def flat_name(namespace: str, name: str) -> str:
    """The name a ``namespace`` tool's function goes by once flattened."""
    return f"{namespace}{NAMESPACE_JOIN}{name}"


def flat_tools(tools: Sequence[Any]) -> list[Any]:
    """``tools`` with each ``namespace`` tool (a named group of functions: ``{"type":
    "namespace", "name", "tools": [...]}``) replaced by its functions, named
    :func:`flat_name` — a shape every API takes; the rest as they are."""
    out: list[Any] = []
    for tool in tools:
        if isinstance(tool, Mapping) and tool.get("type") == "namespace":
            group = str(tool.get("name", ""))
            for member in tool.get("tools") or ():
                c = canonical_tool(member)
                fn = c.get("function") if isinstance(c, Mapping) else None
                if isinstance(fn, Mapping):
                    out.append(
                        {
                            "type": "function",
                            "function": {**fn, "name": flat_name(group, fn["name"])},
                        }
                    )
        else:
            out.append(tool)
    return out


def hosts(tool: Any) -> frozenset[str] | None:
    """The APIs that take this tool as it is, when only some do: a tool an API runs itself
    (web search, file search, code interpreter, MCP, Anthropic's dated tools…), or a ``custom``
    (free-form) tool; ``None`` for a function, which every API takes."""
    if not isinstance(tool, Mapping):
        return None
    kind = tool.get("type")
    if canonical_tool(tool).get("function") is not None or not isinstance(kind, str):
        return None
    if kind == "custom":
        return frozenset({"openai", "openai-responses"})
    if _ANTHROPIC_HOSTED.match(kind):  # first: web_search_20250305 is Anthropic's
        return frozenset({"anthropic"})
    if _RESPONSES_HOSTED.match(kind):
        return frozenset({"openai-responses"})
    return None


def _canonical_choice(choice: Any) -> Any:
    if isinstance(choice, Mapping):
        kind = choice.get("type")
        if kind == "tool" and "name" in choice:  # Anthropic
            return {"type": "function", "function": {"name": choice["name"]}}
        if kind == "function" and "name" in choice:  # Responses
            return {"type": "function", "function": {"name": choice["name"]}}
        if kind == "any":
            return "required"
        if kind in ("auto", "none"):
            return kind
    return choice


def _convert(
    body: Mapping[str, Any],
    tool: Callable[[Mapping[str, Any]], Any],
    named: Callable[[str], Any],
    words: Mapping[str, Any],
) -> dict[str, Any]:
    """``tools`` and ``tool_choice`` of ``body`` in one provider's shape: ``tool`` renders a
    function (OpenAI's ``function`` object), ``named`` a choice of one tool, ``words`` the
    choices by word (``auto``, ``none``, ``required``)."""
    out: dict[str, Any] = {}
    if isinstance(body.get("tools"), Sequence):
        tools = []
        for t in body["tools"]:
            c = canonical_tool(t)
            fn = c.get("function") if isinstance(c, Mapping) else None
            tools.append(tool(fn) if isinstance(fn, Mapping) else c)
        out["tools"] = tools
    if "tool_choice" in body:
        choice = _canonical_choice(body["tool_choice"])
        if isinstance(choice, Mapping) and isinstance(choice.get("function"), Mapping):
            out["tool_choice"] = named(str(choice["function"].get("name")))
        else:
            out["tool_choice"] = words.get(choice, choice) if isinstance(choice, str) else choice
    return out


def openai_tools(body: Mapping[str, Any]) -> dict[str, Any]:
    """``tools`` / ``tool_choice`` for Chat Completions (read from any shape)."""
    return _convert(
        body,
        lambda fn: {"type": "function", "function": dict(fn)},
        lambda name: {"type": "function", "function": {"name": name}},
        {},
    )


def _anthropic_tool(fn: Mapping[str, Any]) -> dict[str, Any]:
    tool = {
        "name": fn.get("name"),
        "input_schema": fn.get("parameters") or {"type": "object", "properties": {}},
    }
    if fn.get("description"):
        tool["description"] = fn["description"]
    return tool


def anthropic_tools(body: Mapping[str, Any]) -> dict[str, Any]:
    """``tools`` / ``tool_choice`` for the Messages API."""
    return _convert(
        body,
        _anthropic_tool,
        lambda name: {"type": "tool", "name": name},
        {"required": {"type": "any"}, "auto": {"type": "auto"}, "none": {"type": "none"}},
    )


def responses_tools(body: Mapping[str, Any]) -> dict[str, Any]:
    """``tools`` / ``tool_choice`` for the Responses API (function tools are flat there)."""
    return _convert(
        body,
        lambda fn: {"type": "function", **fn},
        lambda name: {"type": "function", "name": name},
        {},
    )


def _arguments(text: Any) -> Any:
    if isinstance(text, str):
        try:
            return json.loads(text) if text.strip() else {}
        except ValueError:
            return {}
    return text if isinstance(text, Mapping) else {}


def _is_tool_results(message: Mapping[str, Any]) -> bool:
    """OpenAI's ``tool`` turn, Anthropic's user turn of ``tool_result`` blocks, or a Responses
    ``function_call_output`` item: the results of calls, not the user's words."""
    if message.get("role") == "tool" or message.get("type") == "function_call_output":
        return True
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(b, Mapping) and b.get("type") == "tool_result" for b in content
    )


def _call_key(name: Any, arguments: Any) -> tuple[str, str]:
    """A call as compared: its name, and its arguments as canonical JSON (key order and
    spacing aside; arguments that are not JSON, as written)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return str(name), arguments
    return str(name), json.dumps(arguments, sort_keys=True, ensure_ascii=False)


def calls_already_run(messages: Sequence[Mapping[str, Any]]) -> frozenset[tuple[str, str]]:
    """The calls of the conversation's last tool round — the one whose results end it —
    as (name, canonical arguments), in any of the three shapes: what a continuation of the
    answer to those results must not call again (a model asked to "continue" after tool
    results may read it as a new turn and run the same round once more). Calls of earlier
    rounds are not among them: an agent calls them again on purpose (the tests run again
    after an edit), and the uncut answer would have made them. None when the conversation
    does not end with tool results."""
    end = len(messages)
    while end and (
        _is_tool_results(messages[end - 1])
        or messages[end - 1].get("role") in ("system", "developer")
    ):
        end -= 1
    if end == len(messages) or not any(_is_tool_results(m) for m in messages[end:]):
        return frozenset()
    start = end
    while start and messages[start - 1].get("type") == "function_call":
        start -= 1  # a Responses round: one item per call
    found: set[tuple[str, str]] = set()
    for m in messages[start:end] if start < end else messages[end - 1 : end]:
        for call in m.get("tool_calls") or ():
            if isinstance(call, Mapping) and isinstance(fn := call.get("function"), Mapping):
                found.add(_call_key(fn.get("name"), fn.get("arguments")))
        content = m.get("content")
        for block in content if isinstance(content, list) else ():
            if isinstance(block, Mapping) and block.get("type") == "tool_use":
                found.add(_call_key(block.get("name"), block.get("input", {})))
        if m.get("type") == "function_call":
            found.add(_call_key(m.get("name"), m.get("arguments")))
    return frozenset(found)


def is_call_already_run(name: str, arguments: str, already: frozenset[tuple[str, str]]) -> bool:
    """Is this call (``arguments``: its JSON text) one of ``already``?"""
    return _call_key(name, arguments) in already


def anthropic_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Turns with OpenAI-style tool calls and results, as the Messages API takes them:
    ``tool_use`` blocks on the assistant turn, ``tool_result`` blocks in a user turn (results
    that follow each other share one)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        role = m.get("role")
        if role == "assistant" and m.get("tool_calls"):
            blocks: list[dict[str, Any]] = []
            content = m.get("content")
            if isinstance(content, str) and content:
                blocks.append({"type": "text", "text": content})
            elif isinstance(content, list):
                blocks.extend(content_for("anthropic", content))
            for call in m["tool_calls"]:
                fn = call.get("function") or {}
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": call.get("id"),
                        "name": fn.get("name"),
                        "input": _arguments(fn.get("arguments")),
                    }
                )
            out.append({"role": "assistant", "content": blocks})
        elif role == "tool":
            result = {
                "type": "tool_result",
                "tool_use_id": m.get("tool_call_id"),
                "content": m.get("content") if m.get("content") is not None else "",
            }
            last = out[-1] if out else None
            if (
                last is not None
                and last["role"] == "user"
                and isinstance(last["content"], list)
                and all(b.get("type") == "tool_result" for b in last["content"])
            ):
                last["content"].append(result)
            else:
                out.append({"role": "user", "content": [result]})
        else:
            turn = {k: v for k, v in m.items() if k not in ("tool_calls", "name")}
            if isinstance(turn.get("content"), list):
                turn["content"] = content_for("anthropic", turn["content"])
            out.append(turn)
    return out


def responses_input(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Turns with OpenAI-style tool calls and results as Responses API input items."""
    out: list[dict[str, Any]] = []
    for m in messages:
        role = m.get("role")
        if role == "assistant" and m.get("tool_calls"):
            if m.get("content"):
                out.append({"role": "assistant", "content": m["content"]})
            for call in m["tool_calls"]:
                fn = call.get("function") or {}
                out.append(
                    {
                        "type": "function_call",
                        "call_id": call.get("id"),
                        "name": fn.get("name"),
                        "arguments": fn.get("arguments") or "{}",
                    }
                )
        elif role == "tool":
            content = m.get("content")
            out.append(
                {
                    "type": "function_call_output",
                    "call_id": m.get("tool_call_id"),
                    "output": content if isinstance(content, str) else json.dumps(content),
                }
            )
        else:
            item = dict(m)
            if isinstance(item.get("content"), list):
                item["content"] = content_for("openai-responses", item["content"], str(role))
            out.append(item)
    return out
