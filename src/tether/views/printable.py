"""Text a person reads, made safe to show.

What a model or a tool wrote can neither drive a terminal nor hide itself on a page: the CLI and
the inspector both show text through :func:`printable`.
"""

from __future__ import annotations

import json
import unicodedata

_JSON_ESCAPES = {0x08: "\\b", 0x0C: "\\f", 0x0D: "\\r"}
_HIDDEN = ("Cc", "Cf", "Zl", "Zp", "Cs")
"""Control characters (C0, DEL, C1); Unicode's format characters (direction overrides and isolates,
zero-width spaces and joiners, tags) and its line and paragraph separators, unseen or reordering
what is seen around them; and lone surrogates (text decoded with ``surrogateescape``), which no
terminal can draw."""


class _Shown(dict[int, str]):
    """Each character as :func:`printable` shows it, worked out the first time it is met.

    Nothing is built at start-up (every command imports this), and every plane is covered.
    """

    def __missing__(self, code: int) -> str:
        char = chr(code)
        if char in "\n\t" or unicodedata.category(char) not in _HIDDEN:
            shown = char
        else:
            shown = _JSON_ESCAPES.get(code, f"\\u{code:04x}" if code <= 0xFFFF else json.dumps(char)[1:-1])
        self[code] = shown
        return shown


_SHOWN = _Shown()


def printable(text: str) -> str:
    r"""``text`` made safe for a terminal: each control character shown as its JSON escape.

    Model text, tool results and inputs can hold escape sequences (a window title, a screen
    clear, a colour hiding what follows, a carriage return overwriting a line, the 8-bit CSI
    ``\x9b``); printed raw, the terminal would obey them. Invisible characters mislead the
    reader instead: a right-to-left override shows ``/x/\u202efdp.exe`` as ``/x/exe.pdf``,
    and a zero-width space hides inside a word. Newline and tab stay; every other such
    character is written as JSON writes it (``\u001b``, ``\r``, ``\u202e``), so the person
    sees what is there, and JSON text stays valid JSON. One character at a time, so text
    streamed in pieces is safe however a sequence is split.
    """
    return text.translate(_SHOWN)


__all__ = ["printable"]
