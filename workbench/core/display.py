"""Text shown on a terminal that did not come from the workbench's own code: made inert.

A run's ``error`` and ``summary``, a model name, a run folder's name, a claim's statement,
a table's cells: any of them may hold a newline, a carriage return or an ANSI escape
sequence, whether from a damaged file, a hostile one or an exception message. Printed raw,
a newline forges an extra row in a listing and an escape sequence can move the cursor and
rewrite what the screen shows (``status complete`` over ``status failed``). :func:`inert`
is the one way such text is shown: every character that is not printable is written as
its Python escape, so it reads as what it is and does nothing.

Examples:
    >>> inert("failed\\x1b[2K\\rcomplete")
    'failed\\\\x1b[2K\\\\rcomplete'
    >>> inert("run\\nfake-row")
    'run\\\\nfake-row'
"""

from __future__ import annotations

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def inert(text: str) -> str:
    """``text`` with every character that is not printable written as its escape.

    Not printable (Python's :meth:`str.isprintable`): control characters (C0, DEL, C1,
    so the escape that starts an ANSI sequence), line and paragraph separators, format
    characters (bidirectional overrides, zero-width marks), unpaired surrogates and
    unassigned code points. Letters, digits and symbols of every script stay as they are.

    Args:
        text: any string.

    Returns:
        One line that a terminal prints as it reads.
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def _escape(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
