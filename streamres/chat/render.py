"""What the chat writes: the answer as styled Markdown, one status line, and tables.

The answer streams through :class:`MarkdownStyler`, a small streaming Markdown-to-ANSI styler,
rather than Rich's ``Live`` + ``Markdown``: tried on a long answer, ``Live`` re-renders the
whole answer on every refresh (time per token grows with the answer) and cannot redraw what
has scrolled off the top of the terminal, so an answer taller than the screen is printed
again; the styler writes each piece once and holds back at most a line. Rich does what it is
best at here: tables (``/health``, ``/models``, ``/stats``, ``/help``) that fit the
terminal's width, and measuring text in terminal cells (CJK is two cells wide) so the status
line never wraps. Code in fenced blocks is highlighted line by line with Pygments as it
streams.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from rich import box
from rich.cells import cell_len, set_cell_size
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text

__all__ = ["Fitted", "MarkdownStyler", "Screen", "fit", "table"]

BOLD, DIM, ITALIC, RESET = "\x1b[1m", "\x1b[2m", "\x1b[3m", "\x1b[0m"


def _lexer(name: str) -> Any:
    if not name:
        return None
    try:
        from pygments.lexers import get_lexer_by_name
        from pygments.util import ClassNotFound
    except ImportError:  # pragma: no cover - Pygments comes with Rich
        return None
    try:
        return get_lexer_by_name(name, ensurenl=False, stripnl=False)
    except ClassNotFound:
        return None


def _highlight(line: str, lexer: Any) -> str:
    from pygments import highlight
    from pygments.formatters import TerminalFormatter

    return str(highlight(line, lexer, TerminalFormatter()))


class MarkdownStyler:
    """Streaming Markdown to ANSI, one piece at a time, holding back at most a line.

    Handles what chat answers use most: ``**bold**``, ``*italic*``, ```code```, fenced code
    blocks (highlighted when the fence names a language) and ``#`` headings. Markers are
    replaced by styles; everything else passes as is. The output does not depend on how the
    answer was cut into pieces.
    """

    def __init__(self) -> None:
        self._pending = ""
        self._bold = self._italic = self._code = self._fence = self._heading = False
        self._line_start = True
        self._final = False
        self._lexer: Any = None
        self._code_line = ""

    def _style(self) -> str:
        out = RESET
        if self._bold or self._heading:
            out += BOLD
        if self._italic:
            out += ITALIC
        if self._code or (self._fence and self._lexer is None):
            out += DIM
        return out

    def _fence_line(self, buf: str, i: int, out: list[str]) -> int:
        """Inside a fence with a language: a whole line, highlighted (or held until whole)."""
        end = buf.find("\n", i)
        if end < 0:
            self._code_line += buf[i:]
            return len(buf)
        line = self._code_line + buf[i : end + 1]
        self._code_line = ""
        out.append(_highlight(line, self._lexer))
        self._line_start = True
        return end + 1

    def feed(self, text: str) -> str:
        buf = self._pending + text
        self._pending = ""
        out: list[str] = []
        i = 0
        while i < len(buf):
            c = buf[i]
            rest = buf[i:]
            if (
                self._line_start
                and not self._code_line
                and not self._final
                and c in "#`"
                and len(rest) < 4
                and "\n" not in rest
            ):
                self._pending = rest  # could be a heading or a fence: wait for more
                break
            if self._line_start and not self._code_line and rest.startswith("```"):
                end = buf.find("\n", i)
                if end < 0 and not self._final:
                    self._pending = rest
                    break
                end = len(buf) - 1 if end < 0 else end
                self._fence = not self._fence
                self._lexer = _lexer(buf[i + 3 : end].strip()) if self._fence else None
                out.append(self._style())
                i = end + 1
                self._line_start = True
                continue
            if self._fence and self._lexer is not None:
                i = self._fence_line(buf, i, out)
                continue
            if self._line_start and c == "#" and not self._fence:
                j = i
                while j < len(buf) and buf[j] == "#":
                    j += 1
                if j < len(buf) and buf[j] == " ":
                    self._heading = True
                    out.append(self._style())
                    i = j + 1
                    self._line_start = False
                    continue
            self._line_start = False
            if c == "\n":
                if self._heading:
                    self._heading = False
                    out.append(self._style())
                out.append(c)
                self._line_start = True
            elif self._fence:
                out.append(c)
            elif c == "`":
                self._code = not self._code
                out.append(self._style())
            elif c == "*" and not self._code:
                if i + 1 == len(buf) and not self._final:
                    self._pending = c
                    break
                if i + 1 < len(buf) and buf[i + 1] == "*":
                    self._bold = not self._bold
                    i += 1
                else:
                    self._italic = not self._italic
                out.append(self._style())
            else:
                out.append(c)
            i += 1
        return "".join(out)

    def close(self) -> str:
        """End of the answer: what was held back, then plain style."""
        self._final = True
        tail = self.feed("")
        if self._code_line:
            tail += _highlight(self._code_line, self._lexer)
            self._code_line = ""
        self._final = False
        return tail + RESET


def fit(text: str, width: int) -> str:
    """``text`` cut to ``width`` terminal cells (CJK counts two), with "…" when cut."""
    if cell_len(text) <= width:
        return text
    return set_cell_size(text, max(0, width - 1)).rstrip() + "…"


def columns(out: TextIO) -> int:
    try:
        import os

        return os.get_terminal_size(out.fileno()).columns
    except (OSError, ValueError, AttributeError):
        return shutil.get_terminal_size().columns


def table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], *, wrap_last: bool = True
) -> Fitted:
    """Figures kept whole on one line; the last column (descriptions) wraps at word
    boundaries to fit the terminal, unless ``wrap_last`` is false. Where the figures do not fit
    the terminal's width (a phone, a split pane), each row becomes a block of its own."""
    return Fitted(tuple(headers), tuple(tuple(r) for r in rows), wrap_last)


@dataclass(frozen=True)
class Fitted:
    """A table that is one when it fits, else one block per row: the first cell as its title,
    then ``header: value`` lines (so no cell is ever shown as a bare "…")."""

    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    wrap_last: bool = True

    def as_table(self) -> Table:
        t = Table(
            box=box.SIMPLE_HEAD,
            show_edge=False,
            pad_edge=False,
            collapse_padding=True,
            highlight=False,
        )
        for i, h in enumerate(self.headers):
            last = self.wrap_last and i == len(self.headers) - 1
            t.add_column(h, no_wrap=not last, overflow="fold" if last else "ellipsis")
        for row in self.rows:
            t.add_row(*row)
        return t

    def _fits(self, width: int) -> bool:
        """Every column but a wrapping last one as wide as its widest cell, one space apart."""
        cols = list(zip(self.headers, *self.rows, strict=True))
        wrapping = cols.pop() if self.wrap_last and cols else ()
        need = sum(max(cell_len(c) for c in col) for col in cols) + 2 * len(cols)
        return need + min(12, max((cell_len(c) for c in wrapping), default=0)) <= width

    def blocks(self, width: int) -> Text:
        out = Text()
        for row in self.rows:
            out.append(fit(row[0], width) + "\n", style="bold")
            for h, cell in zip(self.headers[1:], row[1:], strict=True):
                out.append(f"  {h}: {cell}\n")
        out.rstrip()
        return out

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        yield self.as_table() if self._fits(width) else self.blocks(width)


@dataclass
class Screen:
    """Answer text and one status line, on a terminal or on plain streams."""

    out: TextIO
    err: TextIO
    tty: bool
    markdown: bool
    styler: MarkdownStyler = field(default_factory=MarkdownStyler)
    status_shown: bool = False

    def __post_init__(self) -> None:
        self.console = Console(
            file=self.out if self.tty else self.err,
            force_terminal=self.tty,
            no_color=not self.tty,
            highlight=False,
            soft_wrap=False,
            width=None if self.tty else 100,
        )

    def text(self, text: str) -> None:
        self.clear_status()
        self.out.write(self.styler.feed(text) if self.markdown else text)
        self.out.flush()

    def end_answer(self) -> None:
        self.clear_status()
        if self.markdown:
            self.out.write(self.styler.close())
            self.styler = MarkdownStyler()
        self.out.write("\n")
        self.out.flush()

    def status(self, message: str) -> None:
        if not self.tty:
            print(f"  · {message}", file=self.err, flush=True)
            return
        # One line below the text, never wider than the terminal (a wrapped status line could
        # not be cleared and would stay inside the answer). IND makes room (scrolling if
        # needed, keeping the column), RI comes back, DECSC/DECRC save and restore the cursor.
        line = fit(f"  ⟳ {message}", columns(self.out) - 1)
        room = "" if self.status_shown else "\x1bD\x1bM"
        self.out.write(f"{room}\x1b7\x1bD\r\x1b[2K{DIM}{line}{RESET}\x1b8")
        self.out.flush()
        self.status_shown = True

    def clear_status(self) -> None:
        if self.status_shown:
            self.out.write("\x1b7\x1bD\r\x1b[2K\x1b8")
            self.status_shown = False

    def note(self, message: str) -> None:
        """A line of the app's own (summary, command output), wrapped at word boundaries on a
        terminal."""
        if not self.tty:
            print(message, file=self.err, flush=True)
            return
        self.console.print(message, style="dim", markup=False, highlight=False)
        self.out.flush()

    def show(self, renderable: Any) -> None:
        """A table (or other Rich renderable), fitted to the terminal's width."""
        self.console.print(renderable)
        (self.out if self.tty else self.err).flush()
