"""How well the semantic cache tells a question asked again from a different one.

``streamres bench --semantic``: every labelled pair in ``semantic_pairs.json`` (English and
Chinese; "same" = one answer serves both; a *tuning* set the CJK threshold was chosen on and
a *held-out* set written before any of its scores were seen) is decided exactly as the cache
decides — normalised text first, then the bundled model's cosine against the thresholds, the
same numbers required — and precision (hits that were right) and recall (repeats found) are
reported per set, language and threshold, with the model's cost.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any

from streamres._core.semantic import Semantic, SemanticIndex, normalise

__all__ = ["decide", "evaluate", "load_pairs", "model_cost"]

THRESHOLDS = (0.90, 0.92, 0.93, 0.95, 0.97)


def load_pairs() -> list[dict[str, Any]]:
    here = resources.files("streamres.benchmarks")
    text = here.joinpath("semantic_pairs.json").read_text("utf-8")
    pairs: list[dict[str, Any]] = json.loads(text)["pairs"]
    return pairs


def decide(
    model: Callable[[str], Sequence[float]], semantic: Semantic, asked: str, again: str
) -> float | None:
    """The score with which the cache would answer ``again`` with ``asked``'s answer, or
    ``None`` (a miss)."""
    index = SemanticIndex(1)
    index.add("", "kept", asked, model(normalise(asked)))
    match = index.same("", again, lambda _: True) or index.closest(
        "", again, model(normalise(again)), semantic, lambda _: True
    )
    return match.score if match else None


def evaluate(
    model: Callable[[str], Sequence[float]], pairs: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Precision and recall per set, language and threshold (the CJK threshold as the English
    one in the rows for a given threshold; the defaults in their own row)."""
    settings = [(f"{t:.2f}", Semantic(threshold=t, threshold_cjk=t)) for t in THRESHOLDS]
    settings.append(("defaults", Semantic()))
    rows = []
    groups = sorted({(p["set"], p["lang"]) for p in pairs})
    for label, semantic in settings:
        for group in groups:
            chosen = [p for p in pairs if (p["set"], p["lang"]) == group]
            hits = [(p, decide(model, semantic, p["a"], p["b"])) for p in chosen]
            tp = sum(1 for p, s in hits if s is not None and p["same"])
            fp = sum(1 for p, s in hits if s is not None and not p["same"])
            positives = sum(1 for p in chosen if p["same"])
            rows.append(
                {
                    "threshold": label,
                    "set": group[0],
                    "language": group[1],
                    "pairs": len(chosen),
                    "precision": round(tp / (tp + fp), 2) if tp + fp else None,
                    "recall": round(tp / positives, 2) if positives else None,
                    "wrong_hits": fp,
                }
            )
    return rows


def model_cost(model: Callable[[str], Sequence[float]], loaded_ms: float) -> dict[str, Any]:
    """Load time and microseconds per question (short, and 2,000 characters)."""
    short = normalise("How do I reset my password? 如何重置我的密码？")
    long = normalise(("Explain TCP slow start and congestion avoidance. " * 50)[:2000])
    cost: dict[str, Any] = {"load_ms": round(loaded_ms)}
    for name, text in (("short", short), ("2000_chars", long)):
        n = 2000 if name == "short" else 200
        started = time.perf_counter()
        for _ in range(n):
            model(text)
        cost[f"us_per_{name}_question"] = round((time.perf_counter() - started) / n * 1e6, 1)
    return cost
