"""Continuation requests: how to ask a model to go on from a partial answer.

Strategies:

``prefill``
    A trailing assistant message holding the partial answer; the server continues it.
    Anthropic takes it natively but rejects a final assistant message ending in whitespace,
    so the whitespace is stripped (and the de-duplicator absorbs it when the model re-emits it).
    OpenAI-compatible servers that continue (vLLM, SGLang, llama.cpp's server) need
    ``continue_final_message: true`` and ``add_generation_prompt: false``.
``prefix``
    DeepSeek and Mistral: the trailing assistant message carries ``"prefix": true``.
``partial``
    Moonshot (Kimi) and Qwen on DashScope: the trailing assistant message carries
    ``"partial": true``, and the model continues it.
``instruct``
    For servers that always start a new turn (OpenAI itself, Claude models that refuse
    prefill): the partial answer as an assistant turn, then a short user turn asking to
    continue exactly where it stopped. The model may repeat a little; the de-duplicator
    removes it.

``auto`` picks ``prefill`` for Anthropic, ``prefix`` for Mistral and DeepSeek's ``/beta``
endpoint, ``partial`` for Moonshot and DashScope, ``prefill`` for a server that has shown it
continues a final assistant message, and ``instruct`` for every other OpenAI-compatible server.
The evidence is learned per base URL, from what the server itself sends
(:func:`continues_prefill`): llama.cpp's server names itself in every response (``server:
llama.cpp``) and renders ``continue_final_message`` as the same assistant turn. A model that
answers "prefill not supported" — or any 400 to a prefill/prefix continuation after the first
request was accepted — or that answers a prefill by starting the whole answer again
(llama-cpp-python's server ignores ``continue_final_message``) is switched to ``instruct``, and
remembered.

Instruct has wordings (``wording``): the first puts the partial answer in an assistant turn and
asks in a user turn to continue; the second also quotes the partial answer's last words in the
instruction, so a model that re-reads the instruction rather than its own turn knows where to
pick up. A continuation that ends at the seam, adding nothing, is asked again in the other
wording. Both are in the language of the answer being continued: a Chinese answer (most of its
last letters Han) is asked in Chinese, any other in English. A caller's own instruction (per
call or per route: ``continue_instruction``) replaces the plain wording; the quoting one stays.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "CONTINUE_INSTRUCTION",
    "CONTINUE_INSTRUCTION_ZH",
    "Continuation",
    "Strategy",
    "build_continuation",
    "choose",
    "continues_prefill",
    "instruction",
    "language_of",
    "thinking_enabled",
]

Strategy = Literal["prefill", "prefix", "partial", "instruct"]

CONTINUE_INSTRUCTION = (
    "Your previous reply was cut off. Continue exactly where it stopped, from the next "
    "character: do not repeat anything already written, and add no preamble or commentary."
)


#: The same, for an answer in Chinese.
CONTINUE_INSTRUCTION_ZH = (
    "你上一条回复被截断了。请从中断处的下一个字接着写：不要重复已经写过的内容，"
    "也不要加开场白或说明。"
)


@dataclass(frozen=True, slots=True)
class Continuation:
    """Messages (and extra body fields) for a resumed request, plus what the de-dup needs."""

    messages: list[dict[str, Any]]
    strategy: Strategy
    extra_body: dict[str, Any] = field(default_factory=dict)
    #: Trailing characters of the partial answer that the prefill left out.
    stripped: int = 0


#: How many characters of the partial answer the quoting wording repeats.
QUOTE_CHARS = 160


#: How many of the partial answer's last characters say its language.
_LANGUAGE_CHARS = 400


def language_of(partial: str) -> Literal["en", "zh"]:
    """The language a continuation of ``partial`` is asked in: ``zh`` when most of its last
    letters are Han (a Chinese answer; an English one that names a few Chinese terms is not),
    else ``en``."""
    letters = [c for c in partial[-_LANGUAGE_CHARS:] if c.isalpha()]
    han = sum("\u4e00" <= c <= "\u9fff" or "\u3400" <= c <= "\u4dbf" for c in letters)
    return "zh" if letters and han * 2 > len(letters) else "en"


def instruction(partial: str, wording: int, own: str | None = None) -> str:
    """The user turn that asks to continue, in wording ``wording`` (0: plain, 1: quoting the
    partial answer's last words), in the partial answer's language (:func:`language_of`);
    ``own``: the caller's plain wording, used as it is."""
    chinese = language_of(partial) == "zh"
    if wording % 2 == 0:
        if own:
            return own
        return CONTINUE_INSTRUCTION_ZH if chinese else CONTINUE_INSTRUCTION
    tail = partial[-QUOTE_CHARS:]
    if chinese:
        return (
            f"你上一条回复被截断了，结尾是：«{tail}»。请从中断处的下一个字接着写：不要重复"
            "已经写过的内容，不要从头再写，也不要加开场白或说明。"
        )
    cut = tail.find(" ")
    if len(partial) > QUOTE_CHARS and 0 <= cut < 40:
        tail = tail[cut + 1 :]  # from a word start
    return (
        f"Your previous reply was cut off. It ended with: «{tail}». Continue exactly where "
        "it stopped, from the next word: do not repeat anything already written, do not start "
        "over, and add no preamble or commentary."
    )


def continues_prefill(headers: Mapping[str, str]) -> bool:
    """Does a response's headers show a server that continues a final assistant message
    (``continue_final_message``)? llama.cpp's server says ``server: llama.cpp``."""
    return headers.get("server", "").lower().startswith("llama.cpp")


def thinking_enabled(body: Mapping[str, Any]) -> bool:
    """Anthropic extended thinking is on for this request (prefill is then refused)."""
    thinking = body.get("thinking")
    return isinstance(thinking, Mapping) and thinking.get("type") in ("enabled", "adaptive")


def choose(
    provider: str,
    base_url: str,
    requested: str,
    body: Mapping[str, Any] | None = None,
    *,
    server_continues: bool = False,
) -> Strategy:
    """The strategy for a provider/server when the caller asked for ``requested``;
    ``server_continues``: the server has shown it continues a final assistant message."""
    if provider == "anthropic" and body is not None and thinking_enabled(body):
        return "instruct"  # with thinking on, an assistant turn cannot be prefilled
    if requested in ("prefill", "prefix", "partial", "instruct"):
        return requested  # type: ignore[return-value]
    if provider == "openai-responses":
        return "instruct"  # the Responses API always starts a new turn
    if provider == "anthropic":
        return "prefill"
    host = base_url.lower()
    # DeepSeek takes "prefix" on its beta endpoint only; Mistral on its main API.
    if ("deepseek" in host and "/beta" in host) or "mistral" in host:
        return "prefix"
    if "moonshot" in host or "dashscope" in host:
        return "partial"  # Kimi and Qwen continue a final assistant message marked partial
    if server_continues and provider == "openai":
        return "prefill"
    return "instruct"


def build_continuation(
    messages: list[dict[str, Any]],
    partial: str,
    *,
    strategy: Strategy,
    provider: str,
    thinking: Sequence[Mapping[str, Any]] = (),
    wording: int = 0,
    own_instruction: str | None = None,
) -> Continuation:
    """The request that continues ``partial``, the answer so far to ``messages``.

    ``thinking``: the complete, signed thinking blocks that came before the partial answer
    (Anthropic). They are sent back byte for byte at the start of the assistant turn, as the
    API requires; a thinking block cut off mid-way is never sent (its signature is missing).
    """
    original = list(messages)  # never the caller's list
    if strategy == "instruct":
        content: Any = partial
        if provider == "anthropic" and thinking:
            content = [*map(dict, thinking), {"type": "text", "text": partial}]
        return Continuation(
            messages=[
                *original,
                {"role": "assistant", "content": content},
                {"role": "user", "content": instruction(partial, wording, own_instruction)},
            ],
            strategy=strategy,
        )
    if strategy in ("prefix", "partial"):
        return Continuation(
            messages=[*original, {"role": "assistant", "content": partial, strategy: True}],
            strategy=strategy,
        )
    if provider == "anthropic":
        kept = partial.rstrip()
        return Continuation(
            messages=[*original, {"role": "assistant", "content": kept}] if kept else original,
            strategy=strategy,
            stripped=len(partial) - len(kept),
        )
    return Continuation(
        messages=[*original, {"role": "assistant", "content": partial}],
        strategy=strategy,
        extra_body={"continue_final_message": True, "add_generation_prompt": False},
    )
