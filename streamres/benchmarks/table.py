"""How every benchmark prints its results: a plain-text table, one row per measurement."""

from __future__ import annotations

from typing import Any

__all__ = ["table"]


def table(rows: list[dict[str, Any]], columns: list[str] | None = None) -> str:
    """``rows`` under ``columns`` (by default every key, in the order first seen), aligned;
    booleans as yes/NO, floats to two places (or none, from 100 up)."""
    if columns is None:
        columns = list(dict.fromkeys(k for r in rows for k in r))

    def fmt(v: Any) -> str:
        if isinstance(v, bool):
            return "yes" if v else "NO"
        if isinstance(v, float):
            return f"{v:.2f}" if abs(v) < 100 else f"{v:.0f}"
        return str(v)

    cells = [columns] + [[fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells
    )
