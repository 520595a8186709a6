"""Record streams from a real llama.cpp server (``llama-server``), byte for byte.

    python tests/recordings/llama-cpp/record.py LLAMA_SERVER VOCAB_GGUF

``LLAMA_SERVER``: a ``llama-server`` binary (built from llama.cpp's source, for example the copy
vendored in llama-cpp-python's sdist on PyPI: ``cmake -B build -DLLAMA_CURL=OFF && cmake --build
build --target llama-server``). ``VOCAB_GGUF``: llama.cpp's ``models/ggml-vocab-qwen2.gguf``
(Qwen2's real tokenizer, no weights; the chat templates come from ``models/templates/`` beside
it). No model weights can be downloaded here,
so this script writes a tiny Qwen2-architecture model with random weights around that
vocabulary (``gguf``, llama.cpp's own writer): what it says is noise, but every byte of the
stream — framing, chunk shapes, finish reasons, usage, reasoning deltas, grammar-constrained
output, continuation, logprobs — is llama-server's own. (Tool calls are not recorded: a random
model does not reach the tool-call syntax, and llama-server refuses a custom grammar with
tools.) Greedy decoding and fixed seeds make each
recording the same on every run of the same build.

Writes ``chat-*.sse`` here and their entries in ``../SOURCES.json`` (replayed by
``tests/end_to_end/test_recordings.py`` against the official SDK's reading).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from streamres.upstream.real import launch  # also the llama-cpp-python recorder's

HERE = Path(__file__).parent
SOURCES = HERE.parent / "SOURCES.json"
LLAMA_CPP = "ggml-org/llama.cpp"
#: The llama.cpp commit llama-cpp-python 0.3.36 vendors (its CHANGELOG).
COMMIT = "0c1e57098"

ASK = [{"role": "user", "content": "Say hello."}]
USAGE = {"stream_options": {"include_usage": True}}

#: name -> (request body, what it shows), served with Qwen2.5's chat template
REQUESTS: dict[str, tuple[dict[str, Any], str]] = {
    "text-length": ({"messages": ASK, "max_tokens": 24, **USAGE}, "text cut by max_tokens"),
    "text-no-usage": ({"messages": ASK, "max_tokens": 16}, "no usage chunk unless asked"),
    "json-schema-stop": (
        {
            "messages": ASK,
            "max_tokens": 64,
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "greeting",
                    "schema": {
                        "type": "object",
                        "properties": {"word": {"enum": ["hello", "hi"]}},
                        "required": ["word"],
                        "additionalProperties": False,
                    },
                },
            },
            **USAGE,
        },
        "grammar-constrained text that ends by itself (finish stop)",
    ),
    "continue-final-message": (
        {
            "messages": [*ASK, {"role": "assistant", "content": "Hello! I am"}],
            "continue_final_message": True,
            "add_generation_prompt": False,
            "max_tokens": 16,
            **USAGE,
        },
        "continuing a partial assistant message (streamres's prefill resume)",
    ),
    "logprobs": (
        {"messages": ASK, "max_tokens": 8, "logprobs": True, "top_logprobs": 2, **USAGE},
        "chunks carrying logprobs",
    ),
}
#: Served with Qwen3's chat template: the model opens a thinking block (its first token pushed
#: to ``<think>`` by a logit bias, then held off by the presence penalty) and llama-server
#: streams what follows as ``reasoning_content``, unasked.
THINKING: dict[str, tuple[dict[str, Any], str]] = {
    "qwen3-reasoning": (
        {
            "messages": ASK,
            "max_tokens": 24,
            "logit_bias": [["<think>", 30]],
            "presence_penalty": 100,
            **USAGE,
        },
        "reasoning_content deltas, unasked",
    ),
}
TEMPLATES = {"Qwen-Qwen2.5-7B-Instruct.jinja": REQUESTS, "Qwen-Qwen3-0.6B.jinja": THINKING}


#: The tokens Qwen2.5 and Qwen3 add to Qwen2's vocabulary for tool calls and thinking (their
#: ids in those models), which the vocabulary-only file leaves as padding.
ADDED = {151657: "<tool_call>", 151658: "</tool_call>", 151667: "<think>", 151668: "</think>"}


def make_model(vocab: Path, out: Path) -> None:
    """A tiny Qwen2 model (2 layers, 64 wide) with random weights around ``vocab``."""
    reader = GGUFReader(str(vocab))

    def value(name: str) -> Any:
        field = reader.fields[name]
        kind = field.types[0]
        if kind == GGUFValueType.ARRAY:
            if field.types[1] == GGUFValueType.STRING:
                return [bytes(field.parts[i]).decode("utf-8") for i in field.data]
            return [field.parts[i].tolist()[0] for i in field.data]
        if kind == GGUFValueType.STRING:
            return bytes(field.parts[field.data[0]]).decode("utf-8")
        return field.parts[field.data[0]].tolist()[0]

    n_embd, n_ff, n_head, n_layer = 64, 128, 4, 2
    w = GGUFWriter(str(out), "qwen2")
    w.add_name("tiny-random-qwen2")
    w.add_context_length(2048)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_block_count(n_layer)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(0)
    w.add_tokenizer_model(value("tokenizer.ggml.model"))
    w.add_tokenizer_pre(value("tokenizer.ggml.pre"))
    tokens = value("tokenizer.ggml.tokens")
    types = value("tokenizer.ggml.token_type")
    for i, added in ADDED.items():  # Qwen2.5's and Qwen3's added tokens, at their ids there
        assert tokens[i].startswith("[PAD"), tokens[i]
        tokens[i], types[i] = added, 4  # user-defined: read from text, written as text
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(value("tokenizer.ggml.merges"))
    w.add_eos_token_id(value("tokenizer.ggml.eos_token_id"))
    w.add_bos_token_id(value("tokenizer.ggml.bos_token_id"))
    w.add_pad_token_id(value("tokenizer.ggml.padding_token_id"))
    w.add_chat_template(value("tokenizer.chat_template"))
    rng = np.random.default_rng(7)

    def rand(name: str, *shape: int) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))

    rand("token_embd.weight", len(tokens), n_embd)
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    rand("output.weight", len(tokens), n_embd)
    for i in range(n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(p + "ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        for x in ("q", "k", "v"):
            rand(p + f"attn_{x}.weight", n_embd, n_embd)
            rand(p + f"attn_{x}.bias", n_embd)
        rand(p + "attn_output.weight", n_embd, n_embd)
        rand(p + "ffn_gate.weight", n_ff, n_embd)
        rand(p + "ffn_up.weight", n_ff, n_embd)
        rand(p + "ffn_down.weight", n_embd, n_ff)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def serve(
    binary: str, model: Path, template: Path | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """llama-server (with ``template`` as its chat template), once its health says ready."""

    def argv_at(port: int) -> list[str]:
        argv = [binary, "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "--jinja"]
        argv += ["-c", "2048", "-np", "1", "--seed", "7", "-t", "2", "--alias", "tiny"]
        if template is not None:
            argv += ["--chat-template-file", str(template)]
        return argv

    return launch(argv_at, "/health")


def record(url: str, body: dict[str, Any]) -> bytes:
    request = {"model": "tiny", "stream": True, "temperature": 0, "seed": 7, **body}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=request, timeout=60) as r:
        r.raise_for_status()
        return b"".join(r.iter_raw())


def main(binary: str, vocab: str) -> None:
    version = subprocess.run([binary, "--version"], capture_output=True, text=True)
    build = (version.stdout + version.stderr).strip().splitlines()[0]
    templates = Path(vocab).parent / "templates"
    bodies: dict[str, bytes] = {}
    shows: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "tiny-random-qwen2.gguf"
        make_model(Path(vocab), model)
        for template, requests in TEMPLATES.items():
            proc, url = serve(binary, model, templates / template)
            try:
                for name, (body, shown) in requests.items():
                    bodies[name] = record(url, body)
                    shows[name] = f"{shown}; chat template models/templates/{template}"
            finally:
                proc.terminate()
                proc.wait(timeout=10)
    sources = [
        s for s in json.loads(SOURCES.read_text("utf-8")) if not s["file"].startswith("llama-cpp/")
    ]
    for name, raw in bodies.items():
        file = HERE / f"chat-{name}.sse"
        file.write_bytes(raw)
        sources.append(
            {
                "file": f"llama-cpp/{file.name}",
                "repository": LLAMA_CPP,
                "path": f"tools/server (llama-server {build}): {shows[name]}",
                "commit": COMMIT,
                "api": "chat",
                "framing": "raw bytes, recorded here from llama-server (tests/recordings/llama-cpp/record.py)",
            }
        )
        print(f"{file.name}: {len(raw)} bytes")
    SOURCES.write_text(json.dumps(sources, indent=1, ensure_ascii=False) + "\n", "utf-8")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
