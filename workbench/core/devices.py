"""Which torch device a model loads on: ``cpu``, ``cuda``, ``cuda:N`` or ``mps``, checked
once, before any model loads, by :func:`check_device` (the CLI's ``--device`` and
``WORKBENCH_DEVICE``, and any page or script that takes a device).

The spelling is checked without torch (:func:`parse_device`); whether this machine has
the device asks torch, imported only then (``torch.cuda.is_available()``,
``torch.cuda.device_count()``, ``torch.backends.mps.is_available()``).

Examples:
    >>> check_device("cpu")
    'cpu'
    >>> parse_device(" CUDA:1 ")
    'cuda:1'
"""

from __future__ import annotations

import os
import re

from workbench.core.errors import WorkbenchError
from workbench.core.values import shown

DEVICE_FORMS = ("cpu", "cuda", "cuda:N", "mps")
"""The spellings a device may take (``N``: a CUDA device index from 0)."""
DEVICE_ENV = "WORKBENCH_DEVICE"
"""The environment variable that gives the device when ``--device`` is not given."""

_CUDA_INDEX = re.compile(r"cuda:([0-9]{1,4})")


def parse_device(text: str) -> str:
    """``text`` as a device name, case and surrounding spaces aside (no torch needed).

    Raises:
        WorkbenchError: a spelling that is none of :data:`DEVICE_FORMS`, listing them.
    """
    name = text.strip().lower() if isinstance(text, str) else ""
    if name in ("cpu", "cuda", "mps") or _CUDA_INDEX.fullmatch(name):
        return re.sub(r"cuda:0*([0-9])", r"cuda:\1", name)
    raise WorkbenchError(f"unknown device {shown(text)}; expected one of "
                         f"{', '.join(DEVICE_FORMS)} (N a CUDA device index from 0)")


def check_device(text: str) -> str:
    """The device ``text`` names, if this machine has it.

    Args:
        text: ``cpu``, ``cuda``, ``cuda:N`` or ``mps``.

    Returns:
        The device's name as torch takes it (``"cuda:1"``).

    Raises:
        WorkbenchError: an unknown spelling (listing the known ones), CUDA or MPS on a
            machine without it, a CUDA index this machine does not have.
    """
    name = parse_device(text)
    if name == "cpu":
        return name
    import torch

    if name == "mps":
        if not torch.backends.mps.is_available():
            raise WorkbenchError("mps: not available on this machine "
                                 "(torch.backends.mps.is_available() is False)")
        return name
    if not torch.cuda.is_available():
        raise WorkbenchError(f"{name}: not available on this machine "
                             "(torch.cuda.is_available() is False)")
    index = _CUDA_INDEX.fullmatch(name)
    count = torch.cuda.device_count()
    if index is not None and int(index.group(1)) >= count:
        raise WorkbenchError(f"{name}: this machine has {count} CUDA device"
                             f"{'' if count == 1 else 's'} (cuda:0 .. cuda:{count - 1})")
    return name


def chosen_device(given: str | None) -> str:
    """The device a command uses: ``given`` (``--device``), else :data:`DEVICE_ENV`, else
    ``cpu``; checked by :func:`check_device`.

    Raises:
        WorkbenchError: as :func:`check_device`; one from the environment variable says so.
    """
    if given is not None:
        return check_device(given)
    from_env = os.environ.get(DEVICE_ENV, "").strip()
    if not from_env:
        return "cpu"
    try:
        return check_device(from_env)
    except WorkbenchError as exc:
        raise WorkbenchError(f"{exc} (from {DEVICE_ENV})") from None
