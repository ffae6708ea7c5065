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
    """``text`` with its control and other unprintable characters escaped (``\\n``), for
    a message that quotes a name from a file: the message must stay one line."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)
