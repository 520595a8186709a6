"""Every code block of the README and of ``docs/`` runs as written: the ``python`` blocks in a
fresh interpreter, the ``sh`` blocks line by line, against the servers the document starts.

A document's servers are the lines of its ``sh`` blocks that end in ``&`` (the README starts
``streamres serve`` and a ``streamres proxy`` with ``demos/routes.toml``); a page that starts
none talks to what the README starts — ``streamres serve --port 8765 --faults light`` and, for
a block that names port 8787, ``streamres proxy --config demos/routes.toml --port 8787`` — so
every example fits the setup a reader of the README has. Ports are this run's free ones, the
same in the code, the commands and the copy of ``demos/`` they read. A ``pip install`` line is
checked, not run: the extra it names exists, the package it names is installed. Blocks fenced
without a language are output or the suite's own commands, and are not run.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(python|sh)\n(.*?)^```$", re.S | re.M)
DEFAULT_SERVERS = (
    "streamres serve --port 8765 --faults light &",
    "streamres proxy --config demos/routes.toml --port 8787 &",
)
PORTS = ("8765", "8787")
EXTRAS = set(
    tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]["optional-dependencies"]
)


def _blocks() -> list[tuple[Path, str, str]]:
    return [
        (doc, kind, code)
        for doc in DOCUMENTS
        for kind, code in FENCE.findall(doc.read_text("utf-8"))
    ]


BLOCKS = _blocks()


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _argv(line: str) -> list[str]:
    """A command line as this interpreter runs it (``streamres`` and ``python`` are ours)."""
    words = shlex.split(line)
    if words[0] == "streamres":
        return [sys.executable, "-m", "streamres", *words[1:]]
    if words[0] == "python":
        return [sys.executable, *words[1:]]
    return words


class Servers:
    """The servers one document starts, on this run's ports, with a copy of ``demos/``."""

    def __init__(self, lines: list[str], where: Path) -> None:
        self.ports = {p: _free_port() for p in PORTS}
        self.where = where
        shutil.copytree(ROOT / "demos", where / "demos")
        routes = where / "demos" / "routes.toml"
        routes.write_text(self.local(routes.read_text("utf-8")), "utf-8")
        self.lines = lines
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def local(self, text: str) -> str:
        for port, mine in self.ports.items():
            text = text.replace(port, mine)
        return text

    def need(self, text: str) -> None:
        """Start, once, the servers ``text`` talks to (the serve before the proxy)."""
        for line in self.lines:
            port = next((p for p in PORTS if p in line), None)
            wanted = port is not None and (port in text or (port == "8765" and "8787" in text))
            if wanted and line not in self.procs:
                self.procs[line] = subprocess.Popen(
                    _argv(self.local(line.rstrip("& "))),
                    cwd=self.where,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                self._listening(int(self.ports[port]), self.procs[line])

    @staticmethod
    def _listening(port: int, proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"the server exited with {proc.returncode}"
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.05)  # polling the condition itself: the port answers
        raise AssertionError(f"nothing listens on {port} after a minute")

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.terminate()
            proc.wait(timeout=15)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[Path, Servers]]:
    made: dict[Path, Servers] = {}
    yield made
    for s in made.values():
        s.stop()


def _servers_of(doc: Path, made: dict[Path, Servers], tmp: pytest.TempPathFactory) -> Servers:
    if doc not in made:
        lines = [
            line.strip()
            for kind, code in FENCE.findall(doc.read_text("utf-8"))
            if kind == "sh"
            for line in code.splitlines()
            if line.strip().endswith("&")
        ]
        made[doc] = Servers(lines or list(DEFAULT_SERVERS), tmp.mktemp(doc.stem))
    return made[doc]


def test_the_documents_have_blocks_to_run() -> None:
    """The blocks are found (a changed fence must not make the tests below vacuous): the
    README's own examples, and the pages' Python blocks."""
    readme = [b for b in BLOCKS if b[0].name == "README.md"]
    assert len([b for b in readme if b[1] == "python"]) >= 3
    assert len([b for b in readme if b[1] == "sh"]) >= 4
    assert len([b for b in BLOCKS if b[0].parent.name == "docs"]) >= 5


def _check_install(line: str) -> None:
    for word in shlex.split(line)[2:]:
        if word.startswith("-"):
            continue
        extra = re.fullmatch(r"(?:streamres|\.|-e \.)\[([\w,]+)\]", word)
        if extra:
            assert set(extra.group(1).split(",")) <= EXTRAS, word
        elif word not in (".", "streamres"):
            assert importlib.util.find_spec(word) is not None, f"{word} is not installed"


@pytest.mark.parametrize(
    ("doc", "kind", "code"),
    BLOCKS,
    ids=[f"{d.relative_to(ROOT)}:{i}" for i, (d, _, _) in enumerate(BLOCKS)],
)
def test_the_block_runs(
    doc: Path,
    kind: str,
    code: str,
    servers: dict[Path, Servers],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The block runs to its end, without an error (in a directory of its own, with a copy of
    ``demos/``: what it writes stays out of the clone)."""
    s = _servers_of(doc, servers, tmp_path_factory)
    s.need(code)
    if kind == "python":
        got = subprocess.run(
            [sys.executable, "-c", s.local(code)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            cwd=s.where,
        )
        assert got.returncode == 0, got.stderr
        return
    for line in code.splitlines():
        line = line.split("  #", 1)[0].strip()
        if not line or line.startswith("#") or line.endswith("&"):
            continue
        if re.match(r"(python -m )?pip install", line):
            _check_install(line.removeprefix("python -m "))
            continue
        got = subprocess.run(
            _argv(s.local(line)),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            cwd=s.where,
        )
        assert got.returncode == 0, f"{line}: {got.stderr}"
