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

from streamres._core.backoff import Backoff
from streamres._core.bounds import ReadLimits
from streamres._core.cache import Cache, CacheStats
from streamres._core.continuation import CONTINUE_INSTRUCTION
from streamres._core.errors import (
    AttemptsExhausted,
    DeadlineExceeded,
    InvalidRequest,
    MissingExtra,
    RequestRejected,
    StreamError,
    UpstreamUnreachable,
)
from streamres._core.events import (
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
from streamres._core.semantic import Semantic
from streamres._core.trickle import PaceFloor
from streamres._fleet.balance import RetryBudget
from streamres._fleet.metrics import Health, ModelMetrics
from streamres._fleet.routes import Route
from streamres._shell.answer_log import AnswerLog
from streamres._shell.batch import BatchProgress, BatchSummary, run_batch
from streamres._shell.client import Client
from streamres._shell.shared import SharedStatus
from streamres._shell.stream import ResilientStream, stream_resilient
from streamres._version import __version__ as __version__

__all__ = [
    "CONTINUE_INSTRUCTION",
    "AnswerLog",
    "Attempt",
    "AttemptsExhausted",
    "Backoff",
    "BatchProgress",
    "BatchSummary",
    "Cache",
    "CacheStats",
    "Client",
    "DeadlineExceeded",
    "DoneEvent",
    "Event",
    "FallbackEvent",
    "Health",
    "InvalidRequest",
    "MissingExtra",
    "ModelMetrics",
    "PaceFloor",
    "ReadLimits",
    "RequestRejected",
    "ResilientStream",
    "ResumeEvent",
    "RetryBudget",
    "RetryEvent",
    "Route",
    "Semantic",
    "SharedStatus",
    "StatusEvent",
    "StreamError",
    "TextEvent",
    "ThinkingEvent",
    "ToolCall",
    "ToolCallEvent",
    "UpstreamUnreachable",
    "Usage",
    "run_batch",
    "stream_resilient",
]
