"""What a ``MODEL`` argument names, decided once for every command.

:func:`parse_model` reads a model argument (``workbench run --model``, ``record``, a sweep
spec's ``models``) as exactly one :data:`Reference`, from its text and a few facts of the
file system, in this order (the first that applies wins):

1. Text no model can be named by: empty, with a control character (a NUL byte, a
   newline) or longer than :data:`MAX_LENGTH`: an error listing the bundled models.
2. A bundled model's name (:data:`workbench.models.zoo.MODELS`): :class:`Bundled`, even
   when a file or folder of that name is in the working folder (write ``./minilm`` for it).
3. An existing file or folder (``~`` expanded): a folder holding ``config.json`` is a
   :class:`Folder`, a regular file named ``*.gguf`` a :class:`Gguf`; any other existing
   path is an error saying what it is. An existing path wins over a checkpoint name or a
   hub id spelt the same: a folder ``org/name`` in the working folder hides the hub id.
4. Text written as a path (starting with ``/``, ``./``, ``../`` or ``~``, or ending in
   ``.gguf``) that does not exist: an error, never a hub or checkpoint lookup.
5. Text with a ``:`` (no hub id has one): a checkpoint the workbench trained,
   ``<run-id>:<step>`` or ``<run-id>/L<n>:<step>`` (:class:`Checkpoint`; the step a whole
   number), or a checkpoint glob with shell patterns in the model and the step, such as
   ``<run-id>/L*:*`` (:class:`CheckpointGlob`; the run id cannot be a pattern).
6. A Hugging Face hub id, ``name`` or ``org/name`` (letters, digits, ``-``, ``_``, ``.``):
   :class:`Hub`, noting whether it is in the local Hugging Face cache.
7. Anything else: an error listing the bundled models and the forms above.

Whether a checkpoint exists is for :mod:`workbench.models.checkpoints` to say (it needs the
run store), and whether an uncached hub id can be downloaded for :func:`require_hub`.

Examples:
    >>> parse_model("minilm")
    Bundled(name='minilm')
    >>> parse_model("20250101-120000-induction-formation-none-ab12/L2:1500")
    Checkpoint(run='20250101-120000-induction-formation-none-ab12', model='L2', step=1500)
    >>> parse_model("run-id/L*:*")
    CheckpointGlob(run='run-id', model='L*', step='*')
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

from workbench.core.errors import UnknownNameError, WorkbenchError
from workbench.core.registry import did_you_mean
from workbench.models import zoo

ModelKind = Literal["bundled", "checkpoint", "checkpoint_glob", "folder", "gguf", "hub"]
MAX_LENGTH = 4096
"""The longest model argument read (the longest path Linux opens)."""
GLOB_CHARS = "*?["
CHECKPOINT_FORMS = ("<run-id>:<step>, <run-id>/L<n>:<step>, a glob such as <run-id>/L*:* "
                    "(a sweep), or an existing path")
_STEP = re.compile(r"[0-9]+", re.ASCII)
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.\-]{0,95}(/[\w.\-]{1,96})?", re.ASCII)
_PATH_START = ("/", "./", "../", "~")
_HUB_HOST = ("huggingface.co", 443)


@dataclass(frozen=True)
class Bundled:
    """A bundled model, by its registered name."""

    name: str
    kind: ClassVar[ModelKind] = "bundled"


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint of a run that trained models: ``<run>[/<model>]:<step>``."""

    run: str
    """The run id, or a unique prefix of it."""
    model: str
    """The model as written (``L2``), or ``""`` for the run's only model."""
    step: int
    kind: ClassVar[ModelKind] = "checkpoint"


@dataclass(frozen=True)
class CheckpointGlob:
    """Every checkpoint of a run whose model ``L<n>`` and step match shell patterns."""

    run: str
    model: str
    """The pattern over ``L<n>`` (``L*`` when the text names no model)."""
    step: str
    """The pattern over the step."""
    kind: ClassVar[ModelKind] = "checkpoint_glob"


@dataclass(frozen=True)
class Folder:
    """A local Hugging Face model folder (it holds ``config.json``)."""

    path: Path
    kind: ClassVar[ModelKind] = "folder"


@dataclass(frozen=True)
class Gguf:
    """A local ``.gguf`` file."""

    path: Path
    kind: ClassVar[ModelKind] = "gguf"


@dataclass(frozen=True)
class Hub:
    """A Hugging Face hub id, and whether the local Hugging Face cache holds it."""

    id: str
    cached: bool
    kind: ClassVar[ModelKind] = "hub"


Reference = Bundled | Checkpoint | CheckpointGlob | Folder | Gguf | Hub
"""What a model argument names (see the module docstring for how it is decided)."""


def parse_model(text: str) -> Reference:
    """What the model argument ``text`` names, in the order of the module docstring.

    Args:
        text: a bundled name, a checkpoint or checkpoint glob, a folder or ``.gguf`` path,
            or a hub id.

    Returns:
        The one :data:`Reference` it is.

    Raises:
        UnknownNameError: text that is none of the forms (the message lists the bundled
            models, and the closest one to a misspelt name).
        WorkbenchError: an existing path that is not a model, a path that does not exist,
            or a checkpoint name whose step is not a whole number or whose run id is a
            pattern.
    """
    if not text.strip() or len(text) > MAX_LENGTH or any(
            ord(c) < 32 or ord(c) == 127 for c in text):
        raise unknown(text)
    if text in zoo.MODELS:
        return Bundled(text)
    if (path := _existing(text)) is not None:
        return _local(text, path)
    if text.startswith(_PATH_START) or text.endswith(".gguf"):
        raise WorkbenchError(f"{text} does not exist; expected a Hugging Face model folder "
                             "(with config.json) or a .gguf file")
    if ":" in text:
        return _checkpoint(text)
    if _HUB_ID.fullmatch(text):
        return Hub(text, _hub_cached(text))
    raise unknown(text)


def unknown(text: str, why: str = "") -> UnknownNameError:
    """The one-line error for a model argument that names no model it could.

    Args:
        text: the argument.
        why: what else was tried (replaces the list of forms).
    """
    shown = repr(text) if len(text) <= 80 else repr(text[:77] + "...")
    names = zoo.MODELS.names()
    why = why or ("an existing model folder or .gguf file, a checkpoint "
                  "(<run-id>/L<n>:<step>) or a Hugging Face hub id (org/name)")
    return UnknownNameError(f"unknown model {shown}{did_you_mean(text, names)}: not a bundled "
                            f"model ({', '.join(names)}), {why}")


def _existing(text: str) -> Path | None:
    """The path ``text`` names, if it exists (``None`` for names no path can have)."""
    try:
        path = Path(text).expanduser()
        return path if path.exists() else None
    except (OSError, ValueError, RuntimeError):  # too long, or ~user without a home
        return None


def _local(text: str, path: Path) -> Folder | Gguf:
    if path.is_dir() and (path / "config.json").is_file():
        return Folder(path)
    if path.is_file() and path.suffix == ".gguf":
        return Gguf(path)
    if path.is_dir():
        why = "a folder without config.json"
        if _HUB_ID.fullmatch(text):
            why += f" (it hides the hub id '{text}': load that from another working folder)"
    else:
        why = ("named .gguf but not a regular file" if path.suffix == ".gguf"
               else "a file, not named .gguf")
    raise WorkbenchError(f"{path} is neither a Hugging Face model folder (with config.json) "
                         f"nor a .gguf file: it is {why}")


def _checkpoint(text: str) -> Checkpoint | CheckpointGlob:
    head, _, step = text.rpartition(":")
    run, _, model = head.partition("/")
    if not run:
        raise WorkbenchError(f"{text!r} is not a checkpoint name: it names no run; expected "
                             f"{CHECKPOINT_FORMS}")
    if any(c in text for c in GLOB_CHARS):
        if any(c in run for c in GLOB_CHARS):
            raise WorkbenchError(f"model glob {text!r}: the run id cannot be a pattern; name "
                                 "the run, e.g. <run-id>/L2:*")
        return CheckpointGlob(run, model or "L*", step)
    if not _STEP.fullmatch(step):
        raise WorkbenchError(f"{text!r} is not a checkpoint name: the step {step!r} is not a "
                             f"whole number; expected {CHECKPOINT_FORMS}")
    return Checkpoint(run, model, int(step))


def _hub_cached(hub_id: str) -> bool:
    """Whether the local Hugging Face cache holds ``hub_id``'s config (no network)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(hub_id, "config.json"), str)
    except ValueError:  # an id the hub would refuse ('a..b', '-x')
        return False


def require_hub(ref: Hub) -> None:
    """Check that a hub model can be had: cached, or the hub reachable to download it.

    Raises:
        UnknownNameError: not cached and the hub is unreachable (no network); the message
            lists the bundled models, and the closest one to a misspelt name.
    """
    if not ref.cached and not hub_reachable():
        raise unknown(ref.id, "an existing model folder, .gguf file or checkpoint, nor in the "
                              "local Hugging Face cache, and the hub is unreachable (no "
                              "network), so it cannot be downloaded")


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether a connection to the Hugging Face hub opens within ``timeout`` seconds."""
    try:
        with socket.create_connection(_HUB_HOST, timeout=timeout):
            return True
    except OSError:
        return False
