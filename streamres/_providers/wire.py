"""What every provider module provides: a request description and a stream decoder.

A decoder turns one SSE event of its provider into the answer's next text (often ``""``) and
keeps the few facts the retry loop needs as attributes: the finish reason, whether the
terminal event came, an in-band error, and reported usage. Attributes rather than an event
object per SSE event, because this runs once per token and allocation is the hot path's cost.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from streamres._core.classify import Failure, failure
from streamres._core.events import ToolCall

__all__ = [
    "DECODE_ERRORS",
    "HttpRequest",
    "PartialCall",
    "StreamDecoder",
    "count",
    "normalise_finish",
    "text_or_none",
]

#: What valid JSON of the wrong shape raises in a decoder (``choices: "x"``, ``delta: 1``…) or
#: what JSON nested deeper than Python's stack raises. The shell calls all of them malformed.
DECODE_ERRORS = (
    TypeError,
    AttributeError,
    KeyError,
    IndexError,
    ValueError,
    RecursionError,
    OverflowError,
)


def count(value: Any, default: int | None) -> int | None:
    """A token count as a server reported it, if it is one (an int, not a bool or text)."""
    return value if type(value) is int and value >= 0 else default


def text_or_none(value: Any) -> str | None:
    """A text field: a string, or ``None`` (absent or null). Anything else is malformed."""
    if value is None or type(value) is str:
        return value
    raise TypeError(f"expected a string, got {type(value).__name__}")


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """One streaming request (a POST, or a GET re-attaching to a response), for any client."""

    url: str
    headers: dict[str, str]
    body: dict[str, Any] = field(default_factory=dict)
    method: str = "POST"


_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "pause_turn": "pause",
    "refusal": "content_filter",
    "model_context_window_exceeded": "length",
    # OpenAI-compatible servers that pass their own words through: Together ("eos"), Hugging
    # Face TGI ("eos_token"), some vLLM builds ("abort" is not a stop, and stays as it is).
    "eos": "stop",
    "eos_token": "stop",
}


def normalise_finish(reason: Any) -> str:
    """Provider stop reasons in OpenAI's words: ``stop``, ``length``, ``tool_calls``…"""
    if type(reason) is not str:
        raise TypeError(f"a finish reason must be a string, got {type(reason).__name__}")
    return _FINISH.get(reason, reason)


@dataclass
class PartialCall:
    """A tool call while its arguments stream in."""

    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)
    #: Characters of the arguments so far (an answer's bound counts them).
    size: int = 0
    #: Anthropic closes each block (content_block_stop); a call not closed is not whole.
    requires_close: bool = False
    closed: bool = False
    #: A Responses API custom tool: its input is free text, passed on as a JSON string.
    custom: bool = False

    def add(self, arguments: str) -> None:
        """A piece of the arguments."""
        self.arguments.append(arguments)
        self.size += len(arguments)

    def complete_without_close(self) -> ToolCall | None:
        """As :meth:`complete`, but the arguments must be there and parse (no finish reason
        vouches for the turn, so an empty argument list is not taken as ``{}``)."""
        text = "".join(self.arguments)
        if not (self.id and self.name and text.strip()):
            return None
        return self.complete()

    def as_sent(self) -> ToolCall | None:
        """The call with its arguments exactly as the model wrote them, JSON or not (how the
        official SDKs hand them over once the model finished its turn); None if the call itself
        did not arrive whole (no id or name, an Anthropic block never closed)."""
        if not (self.id and self.name) or (self.requires_close and not self.closed):
            return None
        return self.complete() or ToolCall(
            id=self.id, name=self.name, arguments="".join(self.arguments)
        )

    def complete(self) -> ToolCall | None:
        """The call, if its arguments arrived whole and parse as JSON; else None."""
        text = "".join(self.arguments)
        if not (self.id and self.name) or (self.requires_close and not self.closed):
            return None
        if self.custom:
            return ToolCall(id=self.id, name=self.name, arguments=json.dumps(text))
        if not text.strip():
            # The turn ended (a finish reason) and the call was whole: a tool without
            # parameters (Anthropic sends one empty input_json_delta; some servers leave
            # arguments null). The official SDKs deliver "{}" too.
            return ToolCall(id=self.id, name=self.name, arguments="{}")
        try:
            json.loads(text)
        except ValueError:
            return None
        return ToolCall(id=self.id, name=self.name, arguments=text)


_PARALLEL = ("multi_tool_use.parallel", "parallel")


def _unwrap(call: ToolCall) -> tuple[ToolCall, ...]:
    """OpenAI models sometimes emit their internal ``multi_tool_use.parallel`` wrapper as a
    call: ``{"tool_uses": [{"recipient_name": "functions.x", "parameters": {…}}, …]}``. The
    application declared ``x``, not the wrapper: the calls inside are what it must run."""
    if call.name not in _PARALLEL:
        return (call,)
    try:
        uses = json.loads(call.arguments).get("tool_uses")
    except (ValueError, AttributeError):
        return (call,)
    if not isinstance(uses, list) or not all(
        isinstance(u, dict) and isinstance(u.get("recipient_name"), str) for u in uses
    ):
        return (call,)
    return tuple(
        ToolCall(
            id=f"{call.id}_{i}",
            name=u["recipient_name"].removeprefix("functions."),
            arguments=json.dumps(u.get("parameters") or {}),
        )
        for i, u in enumerate(uses)
    )


class StreamDecoder:
    """Base for the per-provider decoders (see ``_openai`` and ``_anthropic``).

    Besides the answer's text (returned by ``feed``), a turn can carry reasoning and tool calls.
    Those go to ``side`` as ``("thinking", str)`` as they stream, and ``("tool_calls",
    tuple[ToolCall, ...])`` once, when the model finished the turn and *every* call of it
    arrived whole — its arguments as the model wrote them, which a finished turn vouches for
    even when they are not valid JSON (as the official SDKs hand them over); a turn that ended
    without a finish reason only when they parse. All or nothing, never a partial call. The
    shell drains ``side`` once per network read, so the plain-text hot path pays nothing for it.
    """

    __slots__ = (
        "calls",
        "error",
        "final_usage",
        "finish_reason",
        "generating",
        "input_tokens",
        "output_tokens",
        "refusal",
        "response_id",
        "side",
        "signed_thinking",
        "terminal",
    )

    def __init__(self) -> None:
        #: Tool calls being streamed, by their index in the turn.
        self.calls: dict[int, PartialCall] = {}
        #: Reasoning text and completed tool calls, for the shell to pass on.
        self.side: list[tuple[str, Any]] = []
        #: Complete, signed thinking blocks (Anthropic), to send back byte for byte on resume.
        self.signed_thinking: list[dict[str, Any]] = []
        #: Set when the model produced something other than text (reasoning, tool-call
        #: arguments): the model is working, so the stall timer restarts. The shell clears it.
        self.generating = False
        #: Normalised finish reason, once the model said it finished.
        self.finish_reason: str | None = None
        #: The protocol's terminal event arrived (``[DONE]``, ``message_stop``).
        self.terminal = False
        #: An error the stream reported in-band, or a malformed chunk.
        self.error: Failure | None = None
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None
        #: Refusal text the model sent instead of an answer (OpenAI ``delta.refusal``).
        self.refusal: list[str] = []
        #: A usage chunk with no choices came (how OpenAI-compatible servers end a generation).
        self.final_usage = False
        #: The id the server gave this response (a chunk's ``id``, Anthropic's message id, the
        #: Responses API's response id), once one came.
        self.response_id: str | None = None

    def feed(self, name: str, data: bytes) -> str:
        """One SSE event -> the text it adds to the answer (``""`` for none)."""
        raise NotImplementedError

    def _finish_calls(self) -> None:
        """The model ended its turn: hand over every tool call, or flag the turn incomplete."""
        if not self.calls:
            return
        # The model said it finished: its calls are its answer, as written, valid JSON or not
        # (a model's bad JSON is for the application to see, as the official SDKs show it).
        # Only a call that never arrived whole, or a budget that ran out inside one, is not.
        finished = self.finish_reason not in (None, "length")
        parts = sorted(self.calls.items())
        done = [c.as_sent() if finished else c.complete() for _, c in parts]
        calls = tuple(c for c in done if c is not None)
        self.calls = {}
        if len(calls) != len(done) and self.finish_reason == "length":
            # The token budget ran out inside a call: the server said so. The answer ends
            # there (finish "length"), with no call: never a resume into the middle of JSON.
            return
        calls = tuple(c for call in calls for c in _unwrap(call))
        if len(calls) < len(done):
            self.finish_reason = None  # the turn is not complete
            self.error = failure(
                "malformed", "a tool call's arguments did not arrive whole; asking again"
            )
            return
        self.side.append(("tool_calls", calls))

    def end_failure(self) -> Failure | None:
        """At the end of the body: ``None`` if the answer is complete, else why not.

        A finish reason wins over anything after it: the turn was complete (and its tool calls
        already handed over), so a stray error after it must not start the turn again.
        """
        if self.finish_reason is not None:
            return None
        if self.error is not None:
            return self.error
        if self.terminal and self._complete_without_finish():
            return None
        if self.terminal:
            return failure(
                "truncated", "the stream sent its terminator without a finish reason (cut short)"
            )
        return failure("truncated", "the stream ended without its terminal event")

    def _complete_without_finish(self) -> bool:
        """The terminator came with no finish reason: complete, or cut short? Some servers never
        send one (Snowflake Cortex; text-generation-inference with tool calls), while
        llama-cpp-python ends a stream it *cut* the same way. Decided from evidence in the
        stream itself: a final usage chunk (the server accounted for a finished generation), or
        tool calls that are all whole (their arguments parse). Without either: cut short."""
        if self.calls:
            done = [c.complete_without_close() for _, c in sorted(self.calls.items())]
            if all(c is not None for c in done):
                self.calls = {}
                self.side.append(("tool_calls", tuple(c for c in done if c is not None)))
                self.finish_reason = "tool_calls"
                return True
            return False
        if self.final_usage:
            self.finish_reason = "stop"
            return True
        return False

    def _malformed(self, data: bytes) -> str:
        shown = data[:80].decode("utf-8", "replace")
        self.error = failure("malformed", f"unparsable chunk from the server: {shown!r}")
        return ""
