"""The embedded upstream: a deterministic LLM server on loopback, with planned faults.

Tests, the demo and the benchmarks all run against it, offline::

    async with Upstream(faults="529:retry-after=0.2,reset@40") as up:
        async for ev in stream_resilient(msgs, model="m", base_url=up.openai_url):
            ...

From a shell: ``streamres serve --port 8765 --faults storm``.
"""

from ._answers import PREAMBLE, answer_for, split_tokens
from ._faults import PRESETS, Fault, FaultPlan, demo_storm, parse_faults
from ._server import ModelSpec, RecordedRequest, Upstream

__all__ = [
    "PREAMBLE",
    "PRESETS",
    "Fault",
    "FaultPlan",
    "ModelSpec",
    "RecordedRequest",
    "Upstream",
    "answer_for",
    "demo_storm",
    "parse_faults",
    "split_tokens",
]
