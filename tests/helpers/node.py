"""The suite's Node clients: the npm packages ``tests/node`` pins (``package-lock.json``),
installed by ``.ci/run`` with ``npm ci --prefix tests/node``. No test fetches anything: where
Node or a package is missing, the test skips and says which, and the command that brings it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

#: Where ``npm ci`` puts the packages (``STREAMRES_NODE_MODULES`` names another place).
NODE_MODULES = Path(__file__).parents[1] / "node" / "node_modules"


def node_env(*packages: str) -> dict[str, str]:
    """The environment a ``node`` script runs in to ``require`` ``packages``; the test is
    skipped, with the reason, when Node or one of them is not installed."""
    if shutil.which("node") is None:
        pytest.skip("node is not installed (apt-get install nodejs npm)")
    where = Path(os.environ.get("STREAMRES_NODE_MODULES") or NODE_MODULES)
    for package in packages:
        if not (where / package).is_dir():
            pytest.skip(
                f"the npm package {package} is not installed: npm ci --prefix tests/node "
                "(.ci/run does it)"
            )
    return {**os.environ, "NODE_PATH": str(where)}
