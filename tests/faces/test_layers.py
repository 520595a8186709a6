"""The package's floors, read from its imports: no import runs up a floor, no module imports
itself back through others, and the apps use the library's public names and ``_shell.apps``."""

from __future__ import annotations

import ast
import pathlib
import re

import streamres

ROOT = pathlib.Path(streamres.__file__).parent

#: Each room of the package and its floor, from the bottom up: a module may import its own
#: room and the floors below, never one above (``upstream`` is the embedded test server, beside
#: the pure floors; ``benchmarks`` measure everything, and only the command line imports them).
FLOORS: dict[str, float] = {
    "streamres._version": 0,
    "streamres._core": 1,
    "streamres._providers": 2,
    "streamres._fleet": 2,
    "streamres.upstream": 2,
    "streamres._answer": 3,
    "streamres._shell": 4,
    "streamres": 5,  # the public face: __init__, prometheus
    "streamres.chat": 6,
    # the proxy's rooms: its settings, its faces (the APIs' translation), what it keeps of
    # answers, the server; its package face above them
    "streamres.proxy.config": 6.1,
    "streamres.proxy.faces": 6.2,
    "streamres.proxy.answers": 6.3,
    "streamres.proxy.server": 6.4,
    "streamres.proxy": 6.5,
    "streamres.benchmarks": 7,
    "streamres._apps": 8,
    "streamres.__main__": 9,
}

#: What the public apps may import of the library.
APP_NAMES = ("streamres", "streamres.prometheus", "streamres.upstream", "streamres._shell.apps")
#: The apps' own public faces, which the command line opens.
FACES = ("streamres.chat", "streamres.proxy", "streamres.benchmarks")


def _named(path: pathlib.Path) -> list[str]:
    """Every module name ``path`` imports (``from x import y``: ``x``)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names.append(node.module or "")
    return names


def _module(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _room(module: str) -> str:
    """The longest room name ``module`` lies in."""
    best = "streamres"
    for room in FLOORS:
        if (module == room or module.startswith(room + ".")) and len(room) > len(best):
            best = room
    return best


def _imports() -> dict[str, set[str]]:
    """Every module of the package and the package modules it imports (``from x import y``
    counts ``x.y`` when that is a module)."""
    modules = {_module(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
                found.update(
                    f"{node.module}.{a.name}"
                    for a in node.names
                    if f"{node.module}.{a.name}" in modules
                )
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def _app(module: str) -> str:
    """The room, the proxy's rooms taken as one app."""
    room = _room(module)
    return "streamres.proxy" if room.startswith("streamres.proxy") else room


def test_the_floors_cover_every_module() -> None:
    """Every module of the package lies in a room whose floor is known."""
    assert all(_room(m) in FLOORS for m in _imports())


def test_no_import_runs_up_a_floor() -> None:
    """A module imports its own room and the floors below it, never above."""
    graph = _imports()
    upward = [
        f"{a} -> {b}"
        for a, targets in graph.items()
        for b in targets
        if _room(b) != _room(a) and FLOORS[_room(b)] >= FLOORS[_room(a)]
        # the package's own __init__ imports the floors it re-exports (below it): a room's
        # module importing the package means the public face, one floor up
    ]
    assert upward == []


def test_no_module_imports_itself_back() -> None:
    """The import graph has no circle (imports inside functions included)."""
    graph = _imports()
    circles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if nxt in ("streamres",):  # the package's face: re-exports, not a room's code
                continue
            if state.get(nxt) == 1:
                circles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    assert circles == []


def test_the_apps_use_the_public_names() -> None:
    """The terminal chat, the proxy and the command line import the public package, the
    embedded upstream, ``_shell.apps`` and their own rooms (the command line also the other
    apps' public faces) — nothing private beyond that."""
    graph = _imports()
    reached = [
        f"{a} -> {b}"
        for a, targets in graph.items()
        if _app(a) in ("streamres.chat", "streamres.proxy", "streamres._apps")
        for b in targets
        if _app(b) != _app(a)
        and not any(b == n or (n != "streamres" and b.startswith(n + ".")) for n in APP_NAMES)
        and not (_room(a) == "streamres._apps" and b in FACES)
    ]
    assert reached == []


def test_tests_do_not_import_the_benchmarks() -> None:
    """Test helpers live in the tests; only the benchmarks' own tests import a benchmark."""
    tests = pathlib.Path(__file__).parents[1]
    found = [
        f"{path.name}: {n}"
        for path in sorted(tests.rglob("*.py"))
        if "benchmarks" not in path.parts and "recordings" not in path.parts
        for n in _named(path)
        if n.startswith("streamres.benchmarks")
    ]
    assert found == []


def test_the_pure_floors_import_nothing_of_the_shell() -> None:
    """The core, the providers, the fleet and the answer machine are pure: none of their
    modules imports the I/O shell, the apps, an I/O library or a logging library (the machine
    logs through the logger its shell hands it)."""
    forbidden = (
        "streamres._shell",
        "streamres._apps",
        "streamres.proxy",
        "streamres.chat",
        "streamres.benchmarks",
        "anyio",
        "httpx",
        "structlog",
        "logging",
    )
    found = [
        f"{layer}/{path.name}: {n}"
        for layer in ("_core", "_fleet", "_providers", "_answer")
        for path in sorted((ROOT / layer).glob("*.py"))
        for n in _named(path)
        if any(n == f or n.startswith(f + ".") for f in forbidden)
    ]
    assert found == []


def test_no_test_fetches_a_package_while_it_runs() -> None:
    """What the tests need is installed before they run (``.ci/run``: pip, apt, ``npm ci
    --prefix tests/node``): no test module runs a package manager, so the suite passes with
    no network once installed."""
    tests = pathlib.Path(__file__).parents[1]
    fetching = re.compile(
        r"""["'](npm|npx|pip|pip3|apt-get|uv)["']\s*,\s*["'](install|ci|add|i)\b"""
    )
    found = [
        f"{path.relative_to(tests)}: {m.group(0)}"
        for path in sorted(tests.rglob("*.py"))
        if "node_modules" not in path.parts
        for m in fetching.finditer(path.read_text(encoding="utf-8"))
    ]
    assert found == []
