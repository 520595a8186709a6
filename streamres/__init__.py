"""streamres: LLM answers that keep streaming when a model is at capacity.

>>> import streamres
>>> async def main():
...     async for ev in streamres.stream_resilient(
...         [{"role": "user", "content": "Explain TCP slow start."}],
...         model="gpt-4o-mini",
...         base_url="http://127.0.0.1:8765/v1",
...     ):
...         if ev.type == "text":
...             print(ev.text, end="")
"""

from ._backoff import Backoff
from ._balance import RetryBudget
from ._bounds import ReadLimits
from ._client import Client
from ._continuation import CONTINUE_INSTRUCTION
from ._errors import (
    AttemptsExhausted,
    DeadlineExceeded,
    InvalidRequest,
    RequestRejected,
    StreamError,
    UpstreamUnreachable,
)
from ._events import (
    Attempt,
    DoneEvent,
    Event,
    FallbackEvent,
    ResumeEvent,
    RetryEvent,
    StatusEvent,
    TextEvent,
    ThinkingEvent,
    ToolCall,
    ToolCallEvent,
    Usage,
)
from ._metrics import Health, ModelMetrics
from ._routes import Route
from ._stream import ResilientStream, stream_resilient

__all__ = [
    "CONTINUE_INSTRUCTION",
    "Attempt",
    "AttemptsExhausted",
    "Backoff",
    "Client",
    "DeadlineExceeded",
    "DoneEvent",
    "Event",
    "FallbackEvent",
    "Health",
    "InvalidRequest",
    "ModelMetrics",
    "ReadLimits",
    "RequestRejected",
    "ResilientStream",
    "ResumeEvent",
    "RetryBudget",
    "RetryEvent",
    "Route",
    "StatusEvent",
    "StreamError",
    "TextEvent",
    "ThinkingEvent",
    "ToolCall",
    "ToolCallEvent",
    "UpstreamUnreachable",
    "Usage",
    "stream_resilient",
]

__version__ = "0.1.0"
