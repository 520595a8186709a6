"""Record streams from llama-cpp-python's OpenAI-compatible server, byte for byte.

    python tests/recordings/llama-cpp-python/record.py VOCAB_GGUF

Run with a Python where ``llama_cpp.server`` imports (``pip install 'llama-cpp-python[server]'``
builds it from source; or the sdist's ``llama_cpp`` on ``PYTHONPATH`` with the libraries a
llama.cpp build made copied into ``llama_cpp/lib``). ``VOCAB_GGUF`` and the model: as in
``../llama-cpp/record.py`` (a tiny random-weight Qwen2 around llama.cpp's Qwen2 vocabulary).

What this server does that others do not, recorded: a request arriving while an answer streams
**cuts that answer** (one global lock; ``interrupt_requests`` is on by default): it gets
``data: [DONE]`` with no finish reason — a truncation that looks like an ending.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).parent
SOURCES = HERE.parent / "SOURCES.json"
REPOSITORY = "abetlen/llama-cpp-python"
VERSION = "0.3.36"
ASK = [{"role": "user", "content": "Say hello."}]


def _recorder() -> Any:
    spec = importlib.util.spec_from_file_location("record", HERE.parent / "llama-cpp" / "record.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def serve(model: Path) -> tuple[subprocess.Popen[bytes], str]:
    """llama-cpp-python's server, once it lists its models."""

    def argv_at(port: int) -> list[str]:
        argv = [sys.executable, "-m", "llama_cpp.server", "--model", str(model)]
        return [*argv, "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "512", "--seed", "7"]

    return _recorder().launch(argv_at, "/v1/models")


def _body(**kw: Any) -> dict[str, Any]:
    return {"model": "tiny", "stream": True, "temperature": 0, "seed": 7, "messages": ASK, **kw}


def record(url: str, body: dict[str, Any], *, then: Any = None) -> bytes:
    """The raw response body; ``then`` runs (in a thread) once the first bytes are in."""
    got = b""
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as r:
        try:
            for data in r.iter_raw():
                got += data
                if then is not None and got.count(b"\n\n") >= 3:
                    threading.Thread(target=then).start()
                    then = None
        except httpx.HTTPError:
            pass  # an unclean close: what came is the recording
    return got


def main(vocab: str) -> None:
    bodies: dict[str, tuple[bytes, str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "tiny-random-qwen2.gguf"
        _recorder().make_model(Path(vocab), model)
        proc, url = serve(model)
        try:
            bodies["text-length"] = (
                record(url, _body(max_tokens=12)),
                "text cut by max_tokens",
            )

            def interrupt() -> None:
                httpx.post(
                    f"{url}/v1/chat/completions",
                    json={**_body(max_tokens=2), "stream": False},
                    timeout=60,
                )

            bodies["cut-by-next-request"] = (
                record(url, _body(max_tokens=400), then=interrupt),
                "an answer cut by the next request: [DONE] with no finish reason",
            )
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    sources = [s for s in json.loads(SOURCES.read_text("utf-8")) if s["repository"] != REPOSITORY]
    for name, (raw, shows) in bodies.items():
        file = HERE / f"chat-{name}.sse"
        file.write_bytes(raw)
        sources.append(
            {
                "file": f"llama-cpp-python/{file.name}",
                "repository": REPOSITORY,
                "path": f"llama_cpp/server (llama-cpp-python {VERSION}): {shows}",
                "commit": f"v{VERSION}",
                "api": "chat",
                "framing": "raw bytes, recorded here from llama_cpp.server "
                "(tests/recordings/llama-cpp-python/record.py)",
            }
        )
        print(f"{file.name}: {len(raw)} bytes")
    SOURCES.write_text(json.dumps(sources, indent=1, ensure_ascii=False) + "\n", "utf-8")


if __name__ == "__main__":
    main(sys.argv[1])
