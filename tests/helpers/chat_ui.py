"""A chat UI's tool-using conversation, as Open WebUI sends it: its 36 built-in tools offered
with every request, and a history where the model's tool round has run."""

from __future__ import annotations

from typing import Any

__all__ = ["AFTER_TOOLS", "QUESTION", "TOOLS"]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": f"tool_{i}",
            "description": f"Built-in tool {i}",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    }
    for i in range(36)
]
QUESTION = {"role": "user", "content": "What is the weather in Paris, and what should I wear?"}
AFTER_TOOLS: list[dict[str, Any]] = [
    QUESTION,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_a",
                "type": "function",
                "function": {"name": "tool_3", "arguments": '{"query": "Paris weather"}'},
            },
            {
                "id": "call_b",
                "type": "function",
                "function": {"name": "tool_7", "arguments": '{"query": "Paris forecast"}'},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "call_a", "content": "18 °C, cloudy"},
    {"role": "tool", "tool_call_id": "call_b", "content": "rain after 16:00"},
]
