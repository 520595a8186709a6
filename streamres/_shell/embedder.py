"""The semantic cache's embedding model, loaded once, off the event loop. I/O shell.

The bundled model is WordLlama's ``l2_supercat`` (256 dimensions, 16 MB of weights and its
tokenizer inside the ``wordllama`` wheel from PyPI): a static embedding, so a question costs
tens of microseconds, and nothing is fetched from the network — the files are opened from the
package itself (``WordLlama.load()`` would look for the tokenizer on Hugging Face first).
Loading takes about half a second: it runs in a worker thread when the client starts, and
requests made before it is ready are matched only by their normalised text.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import anyio
import anyio.to_thread

from streamres._core.errors import InvalidRequest
from streamres._shell.log import log

__all__ = ["Embedder", "as_vector", "bundled_model"]

#: Questions longer than this are embedded in a worker thread (measured: ~40 µs for a short
#: question on the loop; a thread hop costs more than that).
INLINE_CHARS = 2000

_LOCK = threading.Lock()
_MODEL: Callable[[str], Sequence[float]] | None = None


def bundled_model() -> Callable[[str], Sequence[float]]:
    """The bundled WordLlama model as a text → vector function (loaded once per process)."""
    global _MODEL
    with _LOCK:
        if _MODEL is None:
            _MODEL = _load_wordllama()
        return _MODEL


def _load_wordllama() -> Callable[[str], Sequence[float]]:
    # wordllama calls logging.basicConfig(level=INFO) when imported, which would configure the
    # application's root logger (and print every INFO line of every library to stderr — into
    # a chat's terminal): whatever it adds is taken back.
    top = logging.getLogger()
    handlers, level = list(top.handlers), top.level
    try:
        import wordllama
        from safetensors import safe_open
        from tokenizers import Tokenizer
        from wordllama.inference import WordLlamaInference
    except ImportError as exc:
        raise InvalidRequest(
            "the semantic cache's bundled model needs the wordllama package: "
            "pip install 'streamres[semantic]' (or give Semantic(embed=your_function))",
            reason="invalid",
        ) from exc
    finally:
        for handler in top.handlers[:]:
            if handler not in handlers:
                top.removeHandler(handler)
        top.setLevel(level)
    root = Path(wordllama.__file__).parent
    tokenizer = Tokenizer.from_file(str(root / "tokenizers" / "l2_supercat_tokenizer_config.json"))
    with safe_open(str(root / "weights" / "l2_supercat_256.safetensors"), "np") as f:
        table = f.get_tensor("embedding.weight")
    model: Any = WordLlamaInference(table, tokenizer)

    def embed(text: str) -> Sequence[float]:
        vector: Sequence[float] = model.embed([text])[0]
        return vector

    return embed


def as_vector(value: object) -> Sequence[float]:
    """A model's answer as a vector: one dimension, numbers, finite, not all zero (else
    ``ValueError``: a model that answers otherwise is a failing model)."""
    import numpy as np

    vector = np.asarray(value, dtype=np.float32)
    if vector.ndim != 1 or vector.size == 0 or not np.all(np.isfinite(vector)):
        raise ValueError(f"not a vector of finite numbers (shape {vector.shape})")
    if not np.any(vector):
        raise ValueError("a vector of zeros")
    return cast("Sequence[float]", vector)  # an array: no copy on the way to the index


class Embedder:
    """Text → vector with the configured model, ready once loaded."""

    def __init__(self, embed: Callable[[str], Sequence[float]] | None) -> None:
        self._embed = embed
        #: Set once the model is loaded or could not be.
        self.settled = anyio.Event()
        #: The bundled model is cheap enough to run on the loop for short questions; a user's
        #: own model always runs in a worker thread.
        self._inline = embed is None
        self.failures = 0

    @property
    def ready(self) -> bool:
        return self._embed is not None

    async def load(self) -> None:
        """Load the bundled model in a worker thread (a no-op for the user's own)."""
        try:
            if self._embed is None:
                self._embed = await anyio.to_thread.run_sync(bundled_model)
        finally:
            self.settled.set()

    async def embed(self, text: str) -> Sequence[float] | None:
        """The vector for ``text``, or ``None`` while the model is loading or when it failed
        (the request is then matched by its normalised text only)."""
        model = self._embed
        if model is None:
            return None
        try:
            if self._inline and len(text) <= INLINE_CHARS:
                vector = model(text)
            else:
                vector = await anyio.to_thread.run_sync(model, text)
            return as_vector(vector)
        except Exception as exc:  # the model failing must not fail the answer
            self.failures += 1
            if self.failures == 1:
                log.warning("streamres.semantic_embed_failed", error=f"{type(exc).__name__}: {exc}")
            return None
