"""``streamres proxy``: uninterrupted streams for every chat UI and SDK, unchanged.

An OpenAI- and Anthropic-compatible endpoint on loopback: point any client's base URL at it,
and its answers are resumed, de-duplicated and deadline-bound, with model fallback across
providers. Modules: ``config`` (routes.toml), ``inbound`` (a client's request in any API → one
call), ``outbound`` (events → the client's own wire format), ``app`` (the ASGI application),
``board`` (the health page), ``serve`` (uvicorn, the embedded default).
"""

from streamres.proxy.config import Config, ConfigError, load
from streamres.proxy.server.app import Proxy
from streamres.proxy.server.serve import (
    embedded_models,
    event_loop,
    require_server,
    running,
    serve,
    serve_workers,
)

__all__ = [
    "Config",
    "ConfigError",
    "Proxy",
    "embedded_models",
    "event_loop",
    "load",
    "require_server",
    "running",
    "serve",
    "serve_workers",
]
