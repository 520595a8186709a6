"""What the chat reads: questions through prompt_toolkit, and keys typed during an answer.

Questions are read by a prompt_toolkit ``PromptSession`` (the library behind IPython, pgcli
and litecli): line editing, a persistent history with Ctrl-R search, Esc-Enter for a new line
(a paste keeps its lines), completion of slash commands and model names. While an answer
streams, the terminal is in raw mode with its keys read by :func:`held_keys`: nothing typed
is echoed into the answer; printable keys wait for the next prompt, and Ctrl-C stops the
answer. When stdin is not a terminal, lines are read as they come.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import anyio

__all__ = ["Prompt", "held_keys", "history_path"]


def history_path() -> Path:
    """Where questions are remembered across sessions (``$STREAMRES_HISTORY`` overrides)."""
    explicit = os.environ.get("STREAMRES_HISTORY")
    if explicit:
        return Path(explicit)
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(Path.home(), ".local", "state")
    return Path(state) / "streamres" / "chat_history"


class Prompt:
    """Reads the next question: ``None`` at the end of input (Ctrl-D)."""

    def __init__(self, commands: Sequence[str], models: Sequence[str], hint: str) -> None:
        self.hint = hint
        self.tty = sys.stdin.isatty() and sys.stdout.isatty()
        self._session = None
        if self.tty:
            self._session = self._make(commands, models)

    @staticmethod
    def _make(commands: Sequence[str], models: Sequence[str]):  # type: ignore[no-untyped-def]
        from prompt_toolkit import PromptSession
        from prompt_toolkit.completion import WordCompleter
        from prompt_toolkit.history import FileHistory, InMemoryHistory
        from prompt_toolkit.key_binding import KeyBindings

        keys = KeyBindings()

        @keys.add("escape", "enter")
        def _newline(event) -> None:  # type: ignore[no-untyped-def]
            event.current_buffer.insert_text("\n")

        path = history_path()
        history: FileHistory | InMemoryHistory
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            history = FileHistory(str(path))
        except OSError:  # a read-only home: history for this session only
            history = InMemoryHistory()
        words = [*commands, *models]
        return PromptSession(
            history=history,
            completer=WordCompleter(words, sentence=True, match_middle=False),
            complete_while_typing=False,
            key_bindings=keys,
            enable_history_search=False,
        )

    async def read(self, prompt: str, default: str = "") -> str | None:
        if self._session is None:
            return await _read_plain(prompt)
        from prompt_toolkit.formatted_text import ANSI

        while True:
            try:
                line: str = await self._session.prompt_async(ANSI(prompt), default=default)
                return line
            except KeyboardInterrupt:  # Ctrl-C at the prompt: the line is dropped, a hint shown
                print(self.hint, flush=True)
                default = ""
            except EOFError:
                return None


async def _read_plain(prompt: str) -> str | None:
    sys.stdout.write(prompt)
    sys.stdout.flush()
    line = await anyio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
    return None if line == "" else line.rstrip("\n")


@contextlib.contextmanager
def held_keys(stop: Callable[[], None]) -> Iterator[list[str]]:
    """While an answer streams: keys are not echoed; printable ones are kept (the list this
    yields) for the next prompt, Enter is ignored, and Ctrl-C calls ``stop``."""
    typed: list[str] = []
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        yield typed
        return
    from prompt_toolkit.input import create_input
    from prompt_toolkit.keys import Keys

    inp = create_input()

    def ready() -> None:
        for press in inp.read_keys():
            if press.key == Keys.ControlC:
                stop()
            elif press.key == Keys.BracketedPaste:
                typed.append(press.data.replace("\r\n", "\n").replace("\r", "\n"))
            elif isinstance(press.key, str) and len(press.key) == 1 and press.key.isprintable():
                typed.append(press.key)
            elif press.key in (Keys.Backspace, Keys.ControlH) and typed:
                typed.pop()

    with inp.raw_mode(), inp.attach(ready):
        yield typed
