"""Provider requests and stream decoders, from real wire captures (no network)."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from streamres._core.continuation import CONTINUE_INSTRUCTION, build_continuation, choose
from streamres._core.sse import SSEDecoder
from streamres._providers import anthropic as _anthropic
from streamres._providers import openai as _openai
from streamres._providers.wire import StreamDecoder

OPENAI_OK = (
    b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
    b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"The"},"finish_reason":null}],"usage":null}\n\n'
    b": keep-alive\n\n"
    b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" end"},"finish_reason":null}]}\n\n'
    b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    b'data: {"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}\n\n'
    b"data: [DONE]\n\n"
)
ANTHROPIC_OK = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude","stop_reason":null,"usage":{"input_tokens":25,"output_tokens":1}}}\n\n'
    b'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}\n\n'
    b'event: ping\ndata: {"type": "ping"}\n\n'
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}\n\n'
    b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
    b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}\n\n'
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
)


def decode(decoder: StreamDecoder, body: bytes) -> str:
    """The body's text; at its end, the decoder is asked how it ended (as the machine does),
    which hands over the turn's tool calls."""
    sse = SSEDecoder()
    text = "".join(decoder.feed(n, d) for n, d in sse.feed(body) + sse.close())
    decoder.end_failure()
    return text


async def _via_mock_transport(body: bytes) -> bytes:
    """Bytes as an httpx client streams them, split awkwardly."""
    pieces = [body[i : i + 13] for i in range(0, len(body), 13)]

    async def stream() -> object:
        for p in pieces:
            yield p

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=stream())  # type: ignore[arg-type]

    async with (
        httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client,
        client.stream("POST", "http://test/") as response,
    ):
        return b"".join([c async for c in response.aiter_bytes()])


@pytest.mark.anyio
async def test_openai_stream() -> None:
    """A complete Chat Completions stream: text, finish reason, usage, terminator."""
    dec = _openai.OpenAIDecoder()
    assert decode(dec, await _via_mock_transport(OPENAI_OK)) == "The end"
    assert (dec.finish_reason, dec.terminal, dec.input_tokens, dec.output_tokens) == (
        "stop",
        True,
        9,
        2,
    )
    assert dec.end_failure() is None


def test_anthropic_stream() -> None:
    """A complete Messages stream: text, normalised stop reason, usage."""
    dec = _anthropic.AnthropicDecoder()
    assert decode(dec, ANTHROPIC_OK) == "Hello"
    assert (dec.finish_reason, dec.terminal, dec.input_tokens, dec.output_tokens) == (
        "stop",
        True,
        25,
        15,
    )
    assert dec.end_failure() is None


def test_done_without_finish_reason_is_truncation() -> None:
    """llama-cpp-python's cut stream: [DONE] with no finish_reason (and no usage) is not
    success."""
    dec = _openai.OpenAIDecoder()
    body = OPENAI_OK.replace(b'"finish_reason":"stop"', b'"finish_reason":null')
    body = b"\n\n".join(p for p in body.split(b"\n\n") if b'"usage":{' not in p)
    decode(dec, body)
    failure = dec.end_failure()
    assert failure is not None and failure.kind == "truncated"


def test_a_server_that_never_sends_a_finish_reason_is_complete_with_a_final_usage_chunk() -> None:
    """Snowflake Cortex's shape: no finish reason, then a usage chunk and [DONE]: complete."""
    dec = _openai.OpenAIDecoder()
    body = OPENAI_OK.replace(b'"finish_reason":"stop"', b'"finish_reason":null')
    assert decode(dec, body) == "The end"
    assert dec.end_failure() is None and dec.finish_reason == "stop"


def test_whole_tool_calls_without_a_finish_reason_are_complete() -> None:
    """text-generation-inference's tool calls: no finish reason, [DONE]; the call parses, so
    the turn is complete and the call is handed over."""
    dec = _openai.OpenAIDecoder()
    call = b'data: {"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\\"city\\": \\"Paris\\"}"}}]},"finish_reason":null}]}\n\n'
    decode(dec, call + b"data: [DONE]\n\n")
    assert dec.end_failure() is None and dec.finish_reason == "tool_calls"
    ((kind, calls),) = dec.side
    assert kind == "tool_calls" and calls[0].name == "get_weather"
    cut = _openai.OpenAIDecoder()
    decode(cut, call.replace(b'\\"Paris\\"}', b'\\"Par') + b"data: [DONE]\n\n")
    failure = cut.end_failure()
    assert failure is not None and failure.kind == "truncated"  # arguments cut: not whole


def test_groq_tool_use_failed_in_a_200_stream_is_retried() -> None:
    """Groq's in-band tool_use_failed (the model wrote a malformed call) is transient."""
    dec = _openai.OpenAIDecoder()
    decode(
        dec,
        b'data: {"error":{"message":"Failed to call a function. Please adjust your prompt.","type":"invalid_request_error","code":"tool_use_failed"}}\n\n',
    )
    assert dec.error is not None and dec.error.kind == "transient"


def test_only_the_first_choice_is_the_answer() -> None:
    """Choices other than index 0 (a server answering n > 1) are not mixed into the text."""
    dec = _openai.OpenAIDecoder()
    chunks = b"".join(
        b'data: {"id":"c","choices":[{"index":%d,"delta":{"content":"%s"},"finish_reason":null}]}\n\n'
        % (i, w)
        for i, w in [(0, b"A"), (1, b"x"), (2, b"y"), (0, b"B")]
    )
    assert decode(dec, chunks) == "AB"


def test_parallel_calls_without_an_index_stay_apart() -> None:
    """Mistral sends two calls in one chunk with no index: two calls, not one merged."""
    dec = _openai.OpenAIDecoder()
    body = (
        b'data: {"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"id":"a1","function":{"name":"weather","arguments":"{\\"city\\": \\"Paris\\"}"}},{"id":"b2","function":{"name":"time","arguments":"{}"}}]},"finish_reason":"tool_calls"}]}\n\n'
        b"data: [DONE]\n\n"
    )
    decode(dec, body)
    ((_, calls),) = dec.side
    assert [(c.id, c.name) for c in calls] == [("a1", "weather"), ("b2", "time")]


def test_a_call_cut_by_the_token_limit_ends_as_length_with_no_call() -> None:
    """finish_reason "length" inside a call's arguments: the answer ends there, no call, no
    resume into JSON."""
    dec = _openai.OpenAIDecoder()
    body = (
        b'data: {"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a1","function":{"name":"write","arguments":"{\\"text\\": \\"abc"}}]},"finish_reason":null}]}\n\n'
        b'data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}\n\n'
        b"data: [DONE]\n\n"
    )
    decode(dec, body)
    assert dec.end_failure() is None and dec.finish_reason == "length" and dec.side == []


def test_a_refusal_is_kept_apart_from_the_text() -> None:
    """OpenAI's delta.refusal is refusal text, not answer text, and not lost."""
    dec = _openai.OpenAIDecoder()
    body = (
        b'data: {"id":"c","choices":[{"index":0,"delta":{"refusal":"I can\'t help"},"finish_reason":null}]}\n\n'
        b'data: {"id":"c","choices":[{"index":0,"delta":{"refusal":" with that."},"finish_reason":"stop"}]}\n\n'
    )
    assert decode(dec, body) == ""
    assert "".join(dec.refusal) == "I can't help with that."


def test_empty_body_is_truncation() -> None:
    """An empty 200 body (over-long prompt on llama-cpp-python) is not success."""
    for dec in (_openai.OpenAIDecoder(), _anthropic.AnthropicDecoder()):
        decode(dec, b"")
        failure = dec.end_failure()
        assert failure is not None and failure.kind == "truncated"


def test_in_band_errors() -> None:
    """Errors inside 200 streams, in each provider's shape, are classified."""
    cases = [
        (
            _openai.OpenAIDecoder(),
            b'data: {"error": {"message": "The server had an error", "type": "server_error"}}\n\n',
            "transient",
        ),
        (
            _openai.OpenAIDecoder(),
            b'data: {"id":"x","error":{"code":"server_error","message":"Provider disconnected"},"choices":[{"index":0,"delta":{"content":""},"finish_reason":"error"}]}\n\n',
            "transient",
        ),
        (
            _anthropic.AnthropicDecoder(),
            b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}\n\n',
            "capacity",
        ),
        (
            _openai.OpenAIDecoder(),
            b'data: {"choices":[{"delta":{"content":"broken\n\n',
            "malformed",
        ),
    ]
    for dec, body, kind in cases:
        decode(dec, body)
        assert dec.error is not None and dec.error.kind == kind, body


def test_openai_request_like_the_sdk() -> None:
    """Bearer auth, stream with usage, max_tokens for compatible servers."""
    req = _openai.build_request(
        base_url="http://h/v1/",
        api_key="sk-x",
        model="m",
        messages=[{"role": "user", "content": "q"}],
        max_tokens=50,
        extra_body={"temperature": 0.2},
        extra_headers={},
    )
    assert req.url == "http://h/v1/chat/completions"
    assert req.headers["authorization"] == "Bearer sk-x"
    assert req.body["stream"] is True and req.body["stream_options"] == {"include_usage": True}
    assert (req.body["max_tokens"], req.body["temperature"]) == (50, 0.2)
    official = _openai.build_request(
        base_url="https://api.openai.com/v1",
        api_key="k",
        model="m",
        messages=[],
        max_tokens=5,
        extra_body={},
        extra_headers={},
    )
    assert official.body["max_completion_tokens"] == 5 and "max_tokens" not in official.body


def test_anthropic_request_like_the_sdk() -> None:
    """x-api-key, anthropic-version, system lifted to the top level, max_tokens defaulted."""
    req = _anthropic.build_request(
        base_url="http://h",
        api_key="k",
        model="claude",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "q"}],
        max_tokens=None,
        extra_body={},
        extra_headers={},
    )
    assert req.url == "http://h/v1/messages"
    assert req.headers["x-api-key"] == "k" and req.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in req.headers
    assert req.body["system"] == "Be brief."
    assert req.body["messages"] == [{"role": "user", "content": "q"}]
    assert req.body["max_tokens"] == _anthropic.DEFAULT_MAX_TOKENS
    assert json.dumps(req.body)


MSGS = [{"role": "user", "content": "q"}]


def test_continuation_shapes() -> None:
    """Each strategy builds the request its servers expect."""
    pre = build_continuation(MSGS, "partial answer \n", strategy="prefill", provider="anthropic")
    assert pre.messages[-1] == {"role": "assistant", "content": "partial answer"}
    assert pre.stripped == 2
    vllm = build_continuation(MSGS, "partial ", strategy="prefill", provider="openai")
    assert vllm.messages[-1]["content"] == "partial "
    assert vllm.extra_body == {"continue_final_message": True, "add_generation_prompt": False}
    prefix = build_continuation(MSGS, "partial", strategy="prefix", provider="openai")
    assert prefix.messages[-1] == {"role": "assistant", "content": "partial", "prefix": True}
    kimi = build_continuation(MSGS, "partial", strategy="partial", provider="openai")
    assert kimi.messages[-1] == {"role": "assistant", "content": "partial", "partial": True}
    own = build_continuation(
        MSGS, "partial", strategy="instruct", provider="openai", own_instruction="Go on."
    )
    assert own.messages[-1] == {"role": "user", "content": "Go on."}
    quoting = build_continuation(
        MSGS, "partial", strategy="instruct", provider="openai", own_instruction="Go on.", wording=1
    )
    assert "«partial»" in quoting.messages[-1]["content"]  # the quoting wording stays ours
    inst = build_continuation(MSGS, "partial", strategy="instruct", provider="openai")
    assert inst.messages[-2:] == [
        {"role": "assistant", "content": "partial"},
        {"role": "user", "content": CONTINUE_INSTRUCTION},
    ]
    assert MSGS == [{"role": "user", "content": "q"}]  # the caller's list is untouched


def test_auto_strategy() -> None:
    """auto: prefill for Anthropic, prefix for Mistral and DeepSeek's beta, partial for Kimi
    and DashScope, instruct for the rest."""
    assert choose("anthropic", "https://api.anthropic.com", "auto") == "prefill"
    assert choose("openai", "https://api.deepseek.com/beta", "auto") == "prefix"
    assert choose("openai", "https://api.deepseek.com", "auto") == "instruct"
    assert choose("openai", "https://api.mistral.ai/v1", "auto") == "prefix"
    assert choose("openai", "https://api.openai.com/v1", "auto") == "instruct"
    assert choose("openai", "http://vllm:8000/v1", "prefill") == "prefill"
    assert choose("openai", "https://api.moonshot.cn/v1", "auto") == "partial"
    dashscope = "https://dashscope.aliyuncs.com/compatible-mode/v1"
    assert choose("openai", dashscope, "auto") == "partial"


from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@given(
    st.text(),
    st.booleans(),
    st.sampled_from(["", ',"usage":null', ',"usage":null,"obfuscation":"ab"']),
)
def test_openai_fast_path_agrees_with_json(content: str, ascii_only: bool, tail: str) -> None:
    """The content-chunk fast path reads exactly what json.loads would, for any text."""
    value = json.dumps(content, ensure_ascii=ascii_only)
    chunk = (
        '{"id":"c","object":"chat.completion.chunk","created":1,"model":"m",'
        f'"choices":[{{"index":0,"delta":{{"content":{value}}},"logprobs":null,"finish_reason":null}}]{tail}}}'
    )
    dec = _openai.OpenAIDecoder()
    assert dec.feed("", chunk.encode()) == content
    assert dec.error is None and dec.finish_reason is None


@given(st.text(), st.booleans(), st.integers(min_value=0, max_value=12))
def test_anthropic_fast_path_agrees_with_json(content: str, ascii_only: bool, index: int) -> None:
    """The text-delta fast path reads exactly what json.loads would, for any text."""
    value = json.dumps(content, ensure_ascii=ascii_only)
    event = f'{{"type":"content_block_delta","index":{index},"delta":{{"type":"text_delta","text":{value}}}}}'
    assert _anthropic.AnthropicDecoder().feed("content_block_delta", event.encode()) == content


def test_fast_path_never_hides_errors_or_usage() -> None:
    """Chunks that carry more than content take the full path."""
    dec = _openai.OpenAIDecoder()
    chunk = b'{"id":"c","error":{"message":"overloaded"},"choices":[{"index":0,"delta":{"content":"x"},"logprobs":null,"finish_reason":null}]}'
    dec.feed("", chunk)
    assert dec.error is not None and dec.error.kind == "capacity"
    dec = _openai.OpenAIDecoder()
    chunk = b'{"id":"c","usage":{"prompt_tokens":3,"completion_tokens":4},"choices":[{"index":0,"delta":{"content":"x"},"logprobs":null,"finish_reason":null}]}'
    assert dec.feed("", chunk) == "x"
    assert dec.output_tokens == 4
    dec = _openai.OpenAIDecoder()
    assert (
        dec.feed(
            "",
            b'{"id":"c","choices":[{"index":0,"delta":{"content":"x"},"logprobs":null,"finish_reason":"stop"}]}',
        )
        == "x"
    )
    assert dec.finish_reason == "stop"


def test_an_error_after_the_finish_does_not_undo_the_turn() -> None:
    """A stray error after the finish reason: the answer was complete."""
    dec = _openai.OpenAIDecoder()
    decode(
        dec,
        OPENAI_OK.replace(
            b"data: [DONE]", b'data: {"error": {"message": "late", "type": "server_error"}}'
        ),
    )
    assert dec.end_failure() is None


def test_a_finished_turn_hands_over_arguments_that_do_not_parse_as_sent() -> None:
    """A turn the model finished (``tool_calls``) with a call whose arguments do not parse:
    complete, the call handed over with its arguments as written (as the official SDKs do)."""
    dec = _openai.OpenAIDecoder()
    body = (
        b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"write_file","arguments":"{\\"pa"}}]},"finish_reason":null}]}\n\n'
        b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}\n\n'
    )
    decode(dec, body)
    assert dec.end_failure() is None
    ((kind, calls),) = dec.side
    assert kind == "tool_calls" and [(c.name, c.arguments) for c in calls] == [
        ("write_file", '{"pa')
    ]


def test_a_declared_responses_custom_tool_call_is_delivered() -> None:
    """A custom tool the request declared: its free-text input arrives as the call's
    arguments, a JSON string. One the server ran itself (not declared) is no call."""
    from streamres._providers import responses as _responses

    def events(name: str) -> list[dict[str, object]]:
        return [
            {"type": "response.created", "response": {"id": "r"}},
            {"type": "response.output_item.added", "output_index": 0,
             "item": {"type": "custom_tool_call", "call_id": "c1", "name": name, "input": ""}},
            {"type": "response.custom_tool_call_input.delta", "output_index": 0, "delta": "print("},
            {"type": "response.custom_tool_call_input.delta", "output_index": 0, "delta": "'hi')"},
            {"type": "response.custom_tool_call_input.done", "output_index": 0, "input": "print('hi')"},
            {"type": "response.output_item.done", "output_index": 0, "item": {"type": "custom_tool_call"}},
            {"type": "response.completed", "response": {"id": "r", "status": "completed"}},
        ]  # fmt: skip

    declared = _responses.custom_tool_names({"tools": [{"type": "custom", "name": "code_exec"}]})
    dec = _responses.ResponsesDecoder()
    dec.custom_tools = declared
    for e in events("code_exec"):
        dec.feed(str(e["type"]), json.dumps(e).encode())
    ((_, calls),) = dec.side
    assert dec.finish_reason == "tool_calls"
    assert (calls[0].name, json.loads(calls[0].arguments)) == ("code_exec", "print('hi')")
    server = _responses.ResponsesDecoder()
    server.custom_tools = declared
    for e in events("x_keyword_search"):
        server.feed(str(e["type"]), json.dumps(e).encode())
    assert server.side == [] and server.finish_reason == "stop"


def test_the_internal_parallel_wrapper_is_unwrapped() -> None:
    """A multi_tool_use.parallel call holding two calls: the two calls, with their own ids."""
    from streamres._providers.wire import PartialCall

    dec = _openai.OpenAIDecoder()
    args = {"tool_uses": [
        {"recipient_name": "functions.weather", "parameters": {"location": "San Francisco"}},
        {"recipient_name": "functions.cityAttractions", "parameters": {"city": "Rome"}},
    ]}  # fmt: skip
    dec.calls[0] = PartialCall(
        id="call_9", name="multi_tool_use.parallel", arguments=[json.dumps(args)]
    )
    dec.finish_reason = "tool_calls"
    dec._finish_calls()
    ((_, calls),) = dec.side
    assert [(c.id, c.name, json.loads(c.arguments)) for c in calls] == [
        ("call_9_0", "weather", {"location": "San Francisco"}),
        ("call_9_1", "cityAttractions", {"city": "Rome"}),
    ]


def test_other_servers_stop_words_are_openais() -> None:
    """Together's ``eos`` and TGI's ``eos_token`` are a stop, in the words the README promises."""
    from streamres._providers.wire import normalise_finish

    assert [normalise_finish(r) for r in ("eos", "eos_token", "stop", "length")] == [
        "stop",
        "stop",
        "stop",
        "length",
    ]


def test_a_continuation_is_asked_in_the_language_of_the_answer() -> None:
    """A Chinese answer is asked to go on in Chinese, in both wordings (the quoting one with its
    last characters); an English one — even naming a few Chinese terms — in English."""
    from streamres._core.continuation import (
        CONTINUE_INSTRUCTION,
        CONTINUE_INSTRUCTION_ZH,
        instruction,
        language_of,
    )

    chinese = (
        "拥塞控制的慢启动阶段，发送方每收到一个确认就把拥塞窗口加一，因此窗口每个往返时间翻倍，直到"
    )
    english = (
        "Slow start doubles the congestion window (拥塞窗口) every round trip until a loss or "
    )
    assert (language_of(chinese), language_of(english), language_of("")) == ("zh", "en", "en")
    assert instruction(chinese, 0) == CONTINUE_INSTRUCTION_ZH
    quoting = instruction(chinese, 1)
    assert (
        "结尾是：«" in quoting and chinese[-20:] in quoting and not re.search("[A-Za-z]", quoting)
    )
    assert instruction(english, 0) == CONTINUE_INSTRUCTION
    assert "It ended with: «" in instruction(english, 1)
