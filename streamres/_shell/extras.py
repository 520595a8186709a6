"""Optional parts and the one line that says how to get each. I/O shell (it asks the import
system what is installed).

Every optional feature checks for its package *before* it starts, through :func:`require`, so
a missing package is one :class:`~streamres.MissingExtra` naming the ``pip install`` that fixes
it — from the library and from the CLI alike, never a ``ModuleNotFoundError`` traceback from
deep inside a server or the first stream.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Final

from streamres._core.errors import MissingExtra

__all__ = ["EXTRAS", "install_hint", "installed", "require"]

#: module -> (the streamres extra that installs it, the PyPI package's name)
EXTRAS: Final[dict[str, tuple[str, str]]] = {
    "uvicorn": ("proxy", "uvicorn"),
    "uvloop": ("proxy", "uvloop"),
    "hypercorn": ("hypercorn", "hypercorn"),
    "coredis": ("shared", "coredis"),
    "wordllama": ("semantic", "wordllama"),
    "prometheus_client": ("prometheus", "prometheus-client"),
    "opentelemetry.trace": ("otel", "opentelemetry-api"),
    "httpx_sse": ("bench", "httpx-sse"),
}


def install_hint(module: str) -> str:
    """``pip install 'streamres[extra]'`` for the extra that brings ``module``."""
    extra = EXTRAS[module][0]
    return f"pip install 'streamres[{extra}]'"


def installed(module: str) -> bool:
    """Whether ``module`` can be imported (``sys.modules[name] = None`` blocks it, as Python's
    own import does)."""
    if module in sys.modules and sys.modules[module] is None:
        return False
    if "." in module and not installed(module.rpartition(".")[0]):
        return False
    try:
        return importlib.util.find_spec(module) is not None
    except ValueError:  # imported, with no spec (some test doubles)
        return True
    except ModuleNotFoundError:  # a parent package is missing
        return False


def require(module: str, what: str, *, otherwise: str = "") -> None:
    """Raise :class:`~streamres.MissingExtra` unless ``module`` can be imported; ``what`` says
    who needs it ("streamres proxy", "shared state"…) and ``otherwise`` the other way out, if
    there is one, for the message."""
    if not installed(module):
        extra, package = EXTRAS[module]
        alternative = f" (or {otherwise})" if otherwise else ""
        raise MissingExtra(
            f"{what} needs {package}, which is not installed: {install_hint(module)}" + alternative,
            extra=extra,
        )
