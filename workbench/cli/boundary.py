"""The one boundary between the library and the terminal: :func:`main` parses, sets up
logging and progress bars, refuses an unusable run store, runs the command, and turns
whatever goes wrong into one ``error: ...`` line and an exit status (2 bad input, 1 runtime
failure, 130 interrupted; see :mod:`workbench.cli`)."""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import signal
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workbench.cli.parser import build_parser
from workbench.cli.render import _one_line, log_lines, progress_renderer
from workbench.core import paths, progress
from workbench.core.errors import WorkbenchError


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is so that it unwinds like Ctrl-C (a running run
    is stored as failed) and exits 130."""


_SIGNALLED: list[int] = []
"""The SIGINTs and SIGTERMs received: a command that swallows the exception (the
dashboard's server stops cleanly on it and returns) still ends with status 130."""


def _on_signal(signum: int, frame: Any) -> None:
    _SIGNALLED.append(signum)
    raise _interruption(signum)


def _interruption(signum: int) -> KeyboardInterrupt:
    if signum == signal.SIGTERM:
        return Terminated(f"terminated by signal {signum}")
    return KeyboardInterrupt()


def _handle_signals() -> dict[int, Any]:
    """Route SIGINT and SIGTERM through :func:`_on_signal`; returns the handlers to put
    back. A SIGINT the process was started ignoring (``nohup``, a background job) stays
    ignored."""
    _SIGNALLED.clear()  # main may run again in the same process (tests, scripts)
    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        if signum == signal.SIGINT and signal.getsignal(signum) == signal.SIG_IGN:
            continue
        previous[signum] = signal.signal(signum, _on_signal)
    return previous


_WRITE_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EFBIG}
"""Errors of writing: the line names the place written (the run store, the model cache)."""


def _store_root(args: argparse.Namespace) -> tuple[Path, str]:
    """The run store the command uses, and where that choice came from."""
    given = getattr(args, "runs", None) if args.command == "dashboard" else getattr(
        args, "out", None)
    if given is not None:
        origin = "--runs" if args.command == "dashboard" else "--out"
    else:
        origin = "WORKBENCH_RUNS_DIR" if os.environ.get("WORKBENCH_RUNS_DIR") else "default"
    return paths.runs_dir(given), origin


def _check_store(args: argparse.Namespace) -> None:
    """Refuse a run store that is not a folder, or cannot be written by a command that
    writes one, before anything else happens (before a model loads)."""
    mode = args.store
    if mode is None:
        return
    if getattr(args, "list", False):
        mode = "read"  # reproduce --list only reads
    root, origin = _store_root(args)
    paths.check_store(root, write=mode == "write", origin=origin)


def _inside(path: str, folder: Path) -> bool:
    return Path(os.path.abspath(path)).is_relative_to(os.path.abspath(folder))


def _filename(value: Any) -> str | None:
    return os.fsdecode(value) if isinstance(value, (str, bytes, os.PathLike)) else None


def _os_error_line(exc: OSError, args: argparse.Namespace) -> str:
    """What failed and where: ``cannot write the run store /x: [Errno 28] No space left
    on device``, with the file when the error names one."""
    reason = (f"[Errno {exc.errno}] {exc.strerror}" if exc.errno is not None and exc.strerror
              else str(exc) or type(exc).__name__)
    places = [(paths.cache_dir(), f"the model cache {paths.cache_dir()}")]
    if args.store is not None:
        root, _ = _store_root(args)
        places.insert(0, (root, f"the run store {root}"))
    name, other = _filename(exc.filename), _filename(exc.filename2)
    verb = "cannot write" if exc.errno in _WRITE_ERRNOS else "cannot use"
    if name is None:
        if exc.errno not in _WRITE_ERRNOS:
            return reason
        # a writer library's error names no file: the place this command writes
        return f"{verb} {places[-1 if args.command == 'fetch' else 0][1]}: {reason}"
    files = name if other is None else f"{name} -> {other}"
    place = next((label for folder, label in places if _inside(name, folder)), None)
    return f"{verb} {place}: {reason} ({files})" if place else f"{verb} {files}: {reason}"


def _failure(exc: BaseException, args: argparse.Namespace) -> tuple[str, int]:
    """The one line (without ``error: ``) and the exit status for ``exc``."""
    if isinstance(exc, WorkbenchError):
        return str(exc), 2
    if isinstance(exc, KeyboardInterrupt):
        # Ray turns a KeyboardInterrupt raised inside ray.wait into a plain one: the signal
        # received says which it was
        terminated = isinstance(exc, Terminated) or (_SIGNALLED and _SIGNALLED[-1]
                                                     == signal.SIGTERM)
        return ("terminated (SIGTERM)" if terminated else "interrupted"), 130
    if isinstance(exc, OSError):
        return _os_error_line(exc, args), 1
    if isinstance(exc, UnicodeDecodeError):
        return (f"cannot decode text as {exc.encoding}: {exc.reason} at byte {exc.start}; "
                f"expected UTF-8 text"), 1
    if isinstance(exc, UnicodeEncodeError):  # e.g. printing to a terminal that is not UTF-8
        return (f"cannot encode text as {exc.encoding}: {exc.reason}; set a UTF-8 locale "
                f"(PYTHONIOENCODING=utf-8)"), 1
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":  # torch's
        return f"out of memory{f': {exc}' if str(exc) else ''}", 1
    hint = "" if args.verbose else " (run with -v for the traceback)"
    return f"internal error: {type(exc).__name__}: {exc}{hint}", 1


def _report(exc: BaseException, args: argparse.Namespace) -> int:
    """Write ``exc`` to stderr as one ``error:`` line (the traceback first with ``-v``)."""
    line, status = _failure(exc, args)
    if args.verbose and not isinstance(exc, KeyboardInterrupt):
        traceback.print_exception(exc, file=sys.stderr)
    sys.stderr.write(f"error: {_one_line(line)}\n")
    sys.stderr.flush()
    return status


def main(argv: Sequence[str] | None = None) -> None:
    """Run the command line; exits with status 2 (bad input), 1 (runtime failure or
    internal error) or 130 (interrupted) after a one-line ``error: ...``."""
    args = build_parser().parse_args(argv)
    level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("transformers", "transformer_lens", "httpx", "urllib3", "werkzeug", "ray"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    bars = None if args.quiet else progress_renderer(sys.stderr)
    progress.render_with(bars)
    previous = _handle_signals()
    try:
        _check_store(args)
        with log_lines(bars) if bars is not None else contextlib.nullcontext():
            args.fn(args)
        if _SIGNALLED:
            raise _interruption(_SIGNALLED[-1])
    except BrokenPipeError:
        # stdout closed early (`workbench runs | head`): nothing more to say, and no
        # second error when Python flushes stdout at exit
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except (Exception, KeyboardInterrupt) as exc:  # the one boundary: see the docstring
        sys.exit(_report(exc, args))
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
