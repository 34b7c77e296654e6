"""Text a person reads, made safe to show.

What a model or a tool wrote can neither drive a terminal nor hide itself on a page: the CLI and
the inspector both show text through :func:`printable`.
"""

from __future__ import annotations

import json
import unicodedata

_JSON_ESCAPES = {0x08: "\\b", 0x0C: "\\f", 0x0D: "\\r"}
_INVISIBLE = ("Cf", "Zl", "Zp", "Cs")
"""Unicode's format characters (direction overrides and isolates, zero-width spaces and joiners,
tags) and its line and paragraph separators: unseen, or reordering what is seen around them; and
lone surrogates (text decoded with ``surrogateescape``), which no terminal can draw."""
_CONTROLS = {
    code: _JSON_ESCAPES.get(code, f"\\u{code:04x}" if code <= 0xFFFF else json.dumps(chr(code))[1:-1])
    for code in (
        *(code for code in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if chr(code) not in "\n\t"),
        *(
            code
            for code in (
                *range(0xA0, 0x2100),
                *range(0xD800, 0xE000),
                *range(0xFE00, 0x10000),
                *range(0x1BCA0, 0x1BCA4),
                *range(0xE0000, 0xE0080),
            )
            if unicodedata.category(chr(code)) in _INVISIBLE
        ),
    )
}
"""Every C0 and C1 control character but newline and tab, DEL, and every invisible one, to its JSON escape."""


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
    return text.translate(_CONTROLS)


__all__ = ["printable"]
