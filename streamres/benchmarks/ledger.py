"""The token ledger's cost per event, against encoding each delta and re-encoding the whole.
Part of ``streamres bench``."""

from __future__ import annotations

import time
from typing import Any

from streamres.benchmarks.common import Q, words_for
from streamres.upstream import answer_for, split_tokens


def ledger(sizes: list[int]) -> list[dict[str, Any]]:
    from streamres._core.tokens import TokenLedger, counter_for

    _, count = counter_for("gpt-4o-mini")
    rows = []
    for size in sizes:
        pieces = [p for p, _ in split_tokens(answer_for(Q, words=words_for(size)))]
        n = len(pieces)
        t = time.perf_counter()
        ledger = TokenLedger(count)
        for p in pieces:
            ledger.add(p)
        _ = ledger.tokens
        ledger_us = (time.perf_counter() - t) / n * 1e6
        t = time.perf_counter()
        for p in pieces:
            count(p)
        per_delta_us = (time.perf_counter() - t) / n * 1e6
        row = {"events": n, "ledger_us_per_event": ledger_us, "encode_each_delta_us": per_delta_us}
        if n <= 2000:
            t = time.perf_counter()
            text = ""
            for p in pieces:
                text += p
                count(text)
            row["reencode_whole_us"] = (time.perf_counter() - t) / n * 1e6
        rows.append(row)
    return rows
