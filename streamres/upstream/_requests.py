"""What the embedded upstream checks of a request before it answers: the shapes the real APIs
take, in the words of their 400s, and the Responses API's input as chat messages."""

from __future__ import annotations

from typing import Any

__all__ = ["check_tool_shapes", "input_messages", "malformed"]


def check_tool_shapes(provider: str, body: dict[str, Any]) -> str | None:
    """The real APIs' rules for tools and tool turns, as they answer them with a 400: each
    takes only its own shape (OpenAI's nested ``function``, Anthropic's ``input_schema``, the
    Responses API's flat function tools; ``tool`` turns only on Chat Completions)."""
    for i, tool in enumerate(body.get("tools") or ()):
        if not isinstance(tool, dict):
            return f"tools.{i}: Input should be an object"
        custom = provider == "anthropic" and tool.get("type") in (None, "custom", "function")
        if custom and ("input_schema" not in tool or "name" not in tool):
            return f"tools.{i}.custom.input_schema: Field required"
        if provider == "openai" and not isinstance(tool.get("function"), dict):
            return f"Missing required parameter: 'tools[{i}].function'."
        if provider == "responses" and tool.get("type") == "function" and "name" not in tool:
            return f"Missing required parameter: 'tools[{i}].name'."
    messages = body.get("messages") if provider != "responses" else None
    for i, m in enumerate(messages or ()):
        if not isinstance(m, dict):
            continue
        if provider == "anthropic" and (m.get("role") == "tool" or "tool_calls" in m):
            return f"messages.{i}: Anthropic takes tool_use and tool_result blocks, not tool turns"
        content = m.get("content")
        blocks: list[Any] = content if isinstance(content, list) else []
        if provider == "openai" and any(
            isinstance(b, dict) and b.get("type") in ("tool_use", "tool_result") for b in blocks
        ):
            return f"Invalid value for 'messages[{i}].content': tool_use blocks are not supported"
    return None


def malformed(body: Any) -> str | None:
    """What is wrong with a request body's shape, in the words the real APIs use for a 400;
    ``None`` when every field this server reads has the type it reads it as."""
    if not isinstance(body, dict):
        return "the request body must be a JSON object"
    kinds: dict[str, tuple[type, ...]] = {
        "model": (str,),
        "messages": (list,),
        "stream": (bool,),
        "stream_options": (dict,),
        "max_tokens": (int,),
        "max_completion_tokens": (int,),
        "max_output_tokens": (int,),
        "tools": (list,),
        "input": (str, list),
        "system": (str, list),
        "background": (bool,),
    }
    names = {
        str: "a string",
        list: "an array",
        bool: "a boolean",
        dict: "an object",
        int: "an integer",
    }
    for key, types in kinds.items():
        value = body.get(key)
        # A boolean is a Python int, but not a JSON integer.
        wrong = not isinstance(value, types) or (isinstance(value, bool) and bool not in types)
        if value is not None and wrong:
            want = " or ".join(names[t] for t in types)
            return f"Invalid type for '{key}': expected {want}, but got {type(value).__name__}."
    return None


def input_messages(items: Any) -> list[dict[str, Any]]:
    """The Responses API's ``input`` (a string, or message items) as chat messages."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages = []
    for item in items or ():
        if isinstance(item, dict) and item.get("type") == "function_call":
            messages.append({"role": "assistant", "content": ""})
        elif isinstance(item, dict) and item.get("type") == "function_call_output":
            messages.append({"role": "tool", "content": str(item.get("output", ""))})
        elif isinstance(item, dict) and "role" in item:
            content = item.get("content", "")
            if isinstance(content, list):
                content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            messages.append({"role": item["role"], "content": content})
    return messages
