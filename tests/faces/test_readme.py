"""Every Python block in the README runs as written, against `streamres serve --port 8765`
(and `streamres proxy`, on 8787, for the blocks that talk to it)."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
PORT = 8765
PROXY_PORT = 8787


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _running(command: str, port: int) -> Iterator[int]:
    """`streamres COMMAND --port PORT` as the README starts it (any free port if that one is
    taken); yields the port it listens on, from the line it prints first."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamres", command, "--port", str(port if _free(port) else 0)]
        + (["--faults", "light"] if command == "serve" else []),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "… on http://127.0.0.1:PORT …"
        yield int(line.split()[3].rsplit(":", 1)[1])
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    """`streamres serve` as the README says to start it."""
    yield from _running("serve", PORT)


@pytest.fixture(scope="module")
def proxy() -> Iterator[int]:
    """`streamres proxy` as the README says to start it."""
    yield from _running("proxy", PROXY_PORT)


def test_the_readme_has_python_blocks() -> None:
    """The blocks are found (a changed fence must not make the test below vacuous)."""
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("block", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_block_runs(block: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """The block runs to its end in a fresh interpreter (in an empty directory: what it
    writes stays out of the clone), without an error."""
    if str(PROXY_PORT) in block:
        code = block.replace(str(PROXY_PORT), str(request.getfixturevalue("proxy")))
    else:
        code = block.replace(str(PORT), str(request.getfixturevalue("server")))
    got = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert got.returncode == 0, got.stderr
