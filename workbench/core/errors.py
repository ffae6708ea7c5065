"""Errors the workbench raises for bad input.

Every error a user can cause (an unknown name, a bad option, a corrupt file) is a
:class:`WorkbenchError`; the CLI prints its message on one line and exits with status 2.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class WorkbenchError(Exception):
    """Bad input or a broken environment, explained in one line."""


class UnknownNameError(WorkbenchError, KeyError):
    """A name that is not registered. The message lists the registered names."""

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return str(self.args[0])


class ChecksumError(WorkbenchError):
    """A file whose SHA-256 does not match the recorded one."""


class ConfigError(WorkbenchError):
    """A config override that names no field or has the wrong type."""


class ModelCapabilityError(WorkbenchError):
    """An experiment asked a model for something it cannot honestly do."""


def printable(text: str) -> str:
    """``text`` with every character that is not printable written as its escape: the one
    way text that did not come from the workbench's own code is shown.

    A run's ``error`` or ``summary``, a model name, a run folder's name, a claim's
    statement, a table's cells or a name quoted in a message may hold a newline, a carriage
    return or an ANSI escape sequence (from a damaged or hostile file, or an exception).
    Printed raw, a newline forges an extra row or a second message line and an escape
    sequence can rewrite what the screen shows (``complete`` over ``failed``). Not
    printable (:meth:`str.isprintable`): control characters (C0, DEL, C1), line and
    paragraph separators, format characters (bidirectional overrides, zero-width marks),
    unpaired surrogates and unassigned code points; letters, digits and symbols of every
    script stay as they are.

    Examples:
        >>> printable("failed\\x1b[2K\\rcomplete")
        'failed\\\\x1b[2K\\\\rcomplete'
        >>> printable("run\\nfake-row")
        'run\\\\nfake-row'
    """
    if text.isprintable():  # nearly always: one pass in C
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)
