"""``streamres chat``: a terminal chat whose answers keep streaming through capacity errors.

Also the example UI integration: it uses only the public API (``streamres`` and
``streamres.upstream``). The pieces a UI needs are all here: text events written as they come,
one neutral status line updated in place and cleared when text flows again, a summary after an
answer that needed recovery, Ctrl-C that stops an answer but keeps what arrived.

With no configuration it talks to the embedded upstream (two models of one family) under a
fault storm, so resume and fallback show up in the first answer. Modules: ``words`` (every
string, English and Chinese), ``render`` (Markdown styler, status line, tables), ``keys``
(prompt_toolkit input, keys held during an answer), ``app`` (the session and its commands).
"""

from streamres.chat.app import embedded, main, parser, run
from streamres.chat.render import MarkdownStyler
from streamres.chat.words import status_line

__all__ = [
    "MarkdownStyler",
    "embedded",
    "main",
    "parser",
    "run",
    "status_line",
]
