"""What becomes of a request's fields on each route of its model's chain: what is left out
there, and why (the library's tables, :mod:`streamres._providers.fields`). Pure."""

from __future__ import annotations

from collections.abc import Sequence

import streamres
from streamres._shell.apps import for_route, model_reasons
from streamres.proxy.faces.inbound import Call

__all__ = ["HOSTED", "left_out"]

#: How a hosted tool left out is named (``tools: web_search``).
HOSTED = "tools: "


def left_out(call: Call, routes: Sequence[streamres.Route]) -> list[tuple[str, str, str]]:
    """``(route key, field, why)`` for each field of ``call`` a route of its chain leaves
    out. A field a route refuses is not here: the library refuses the request by its name,
    before any request is sent."""
    if not call.params:
        return []
    found = []
    for route in routes:
        try:
            _, left = for_route(
                route.provider, call.params, reasons=model_reasons(route.model, route.thinks)
            )
        except ValueError:
            continue
        found += [(route.key, name, why) for name, why in left]
    return found
