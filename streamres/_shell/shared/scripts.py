"""The Lua scripts of shared state, one ``.lua`` file per operation in ``scripts/``, loaded by
name (as the ``limits`` library ships its own). Each file opens with what its KEYS and ARGV
are and what it returns; each runs atomically in Redis, so processes never race on a
read-modify-write."""

from __future__ import annotations

from importlib import resources

__all__ = ["script"]


def script(name: str, **constants: int) -> str:
    """The source of ``scripts/<name>.lua``, each ``constants`` name replaced by its value."""
    source = resources.files(__package__).joinpath("scripts", f"{name}.lua").read_text("utf-8")
    for key, value in constants.items():
        source = source.replace(key, str(value))
    return source
