"""The senders' clean-less-corrupted outputs of one batch, held in memory or in files.

Edge attribution keeps every sender's difference from the two reference passes until the
backward pass has contracted the last receiver's gradient with it: on gemma3 30,592 floats
per token (a layer's ``z`` and its MLP's output over 18 layers, and the embedding's), 3.7
GiB at 32,768 tokens, more than the rest of what the pass holds. In a folder
(:class:`Differences` with ``folder``), each sender's tensor is one file of raw float32 in
the order of its shape, written as its hook fires and read back a slice of positions at a
time, so the process holds one sender's tensor while they are made and one slice of
positions while they are read. The files sit in the operating system's page cache where
memory allows, which the kernel can drop and read from disk again; a folder on a RAM disk
(a ``tmpfs`` ``TMPDIR``) holds them in memory all the same.

Examples:
    >>> import torch
    >>> d = Differences()
    >>> d.put("a", torch.ones(1, 4, 2))
    >>> d.subtract("a", torch.full((1, 4, 2), 0.25))
    >>> d.positions(slice(1, 3), ["a"])["a"].shape
    torch.Size([1, 2, 2])
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from workbench.core.errors import WorkbenchError


class Differences:
    """Each sender's difference, ``[batch, pos, ...]`` in float32, by hook name.

    Args:
        folder: where each tensor is written as one file (``None``: kept in memory). The
            folder is the caller's: it must exist, and it is left as it is.
    """

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = folder
        self._held: dict[str, Tensor] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._files: dict[str, Path] = {}

    @property
    def names(self) -> list[str]:
        """The senders put so far, in the order they were put."""
        return list(self._shapes)

    def shape(self, name: str) -> tuple[int, ...]:
        """``name``'s shape."""
        return self._shapes[self._known(name)]

    def nbytes(self) -> int:
        """The bytes of every tensor put."""
        return sum(4 * math.prod(shape) for shape in self._shapes.values())

    def put(self, name: str, tensor: Tensor) -> None:
        """Keep ``tensor`` (copied, as float32) as ``name``'s difference so far."""
        if name in self._shapes:
            raise WorkbenchError(f"the difference of {name} is already kept")
        kept = tensor.detach().to(torch.float32, copy=True).contiguous()
        self._shapes[name] = tuple(kept.shape)
        if self.folder is None:
            self._held[name] = kept
        else:
            self._files[name] = self.folder / f"{len(self._files)}.f32"
            kept.numpy().tofile(self._files[name])

    def subtract(self, name: str, tensor: Tensor) -> None:
        """Take ``tensor`` (of ``name``'s shape) away from ``name``'s difference."""
        if tuple(tensor.shape) != self.shape(name):
            raise WorkbenchError(f"{name}: a tensor of shape {tuple(tensor.shape)} cannot be "
                                 f"taken from one of {self.shape(name)}")
        if self.folder is None:
            self._held[name].sub_(tensor.detach())
            return
        whole = self.whole(name)
        whole.sub_(tensor.detach())
        whole.numpy().tofile(self._files[name])

    def whole(self, name: str) -> Tensor:
        """``name``'s difference (in memory: the tensor kept itself; from a folder: read)."""
        if self.folder is None:
            return self._held[self._known(name)]
        return torch.from_numpy(np.fromfile(self._files[self._known(name)], dtype=np.float32)
                                ).reshape(self._shapes[name])

    def positions(self, at: slice, names: Iterable[str]) -> dict[str, Tensor]:
        """Each of ``names``' differences at the positions ``at`` (a step-1 slice)."""
        return {name: self._positions(name, at) for name in names}

    def _positions(self, name: str, at: slice) -> Tensor:
        shape = self.shape(name)
        if self.folder is None:
            return self._held[name][:, at]
        batch, width, rest = shape[0], shape[1], shape[2:]
        p0, p1, step = at.indices(width)
        if step != 1:
            raise WorkbenchError(f"positions are read in steps of 1, not {step}")
        row, count = math.prod(rest), max(0, p1 - p0)
        out = np.empty((batch, count * row), dtype=np.float32)
        with self._files[name].open("rb") as f:
            for b in range(batch):
                f.seek(4 * (b * width + p0) * row)
                if f.readinto(memoryview(out[b]).cast("B")) != out[b].nbytes:
                    raise WorkbenchError(f"{self._files[name]}: shorter than {name}'s "
                                         f"difference of shape {shape}")
        return torch.from_numpy(out).reshape(batch, count, *rest)

    def _known(self, name: str) -> str:
        if name not in self._shapes:
            raise WorkbenchError(f"no difference is kept for {name}; kept: "
                                 f"{', '.join(self._shapes) or 'none'}")
        return name


class Outputs:
    """One float32 tensor of ``shape`` per sender, by its index in the graph's order, each
    one file of raw float32 in ``folder`` (an edge-ablation pass's references and its
    differences from them at long context, :mod:`workbench.interventions.circuits.ablate`).
    A tensor not yet written reads as zeros.

    Args:
        folder: the caller's folder, which must exist.
        prefix: the files' names begin with it (two stores can share a folder).
        shape: every tensor's shape.
    """

    def __init__(self, folder: Path, prefix: str, shape: tuple[int, ...]) -> None:
        self.folder, self.prefix, self.shape = folder, prefix, tuple(shape)
        self._buffer: Tensor | None = None

    def path(self, index: int) -> Path:
        """Where sender ``index``'s tensor is written."""
        return self.folder / f"{self.prefix}-{index}.f32"

    def write(self, index: int, tensor: Tensor) -> None:
        """Sender ``index``'s tensor is ``tensor`` (of :attr:`shape`, as float32)."""
        if tuple(tensor.shape) != self.shape:
            raise WorkbenchError(f"sender {index}: a tensor of shape {tuple(tensor.shape)} "
                                 f"in a store of {self.shape}")
        tensor.detach().to(torch.float32).contiguous().numpy().tofile(self.path(index))

    def add(self, index: int, tensor: Tensor) -> None:
        """Add ``tensor`` to sender ``index``'s (zeros where none is written yet)."""
        self.write(index, self.read(index).add_(tensor))  # the read's buffer, written

    def read(self, index: int) -> Tensor:
        """Sender ``index``'s tensor, read into one buffer that the next read overwrites
        (copy it to keep it)."""
        if self._buffer is None:
            self._buffer = torch.empty(self.shape, dtype=torch.float32)
        path = self.path(index)
        if not path.exists():
            return self._buffer.zero_()
        view = self._buffer.numpy().data.cast("B")
        with path.open("rb") as f:
            if f.readinto(view) != view.nbytes or f.read(1):
                raise WorkbenchError(f"{path}: not one tensor of shape {self.shape} in "
                                     f"float32")
        return self._buffer


SPILL_BYTES = 1 << 24
"""The smallest tensor :func:`spilled` writes to its folder (16 MiB)."""


@contextlib.contextmanager
def spilled(folder: Path | None, model: torch.nn.Module) -> Iterator[None]:
    """Within it, what autograd saves for the backward pass from outside a checkpointed
    block (each block's input, which the block's backward recomputes it from: on gemma3
    at 32,768 tokens 18 x 84 MB) is written to ``folder`` and read back when the backward
    pass needs it, where it is a tensor of :data:`SPILL_BYTES` or more that is not the
    storage of one of ``model``'s parameters or buffers (a weight is in memory already).
    ``None``: nothing is written. The pattern of PyTorch's "saving tensors to disk"
    (``torch.autograd.graph.saved_tensors_hooks``); a tensor saved inside a checkpointed
    block is the checkpoint's own and is not written."""
    if folder is None:
        yield
        return
    weights = {t.untyped_storage().data_ptr()
               for t in itertools.chain(model.parameters(), model.buffers())}
    count = itertools.count()

    def pack(tensor: Tensor) -> Tensor | _Saved:
        if (tensor.numel() * tensor.element_size() < SPILL_BYTES or tensor.device.type != "cpu"
                or tensor.untyped_storage().data_ptr() in weights):
            return tensor
        return _Saved(folder / f"saved-{next(count)}.pt", tensor)

    def unpack(packed: Tensor | _Saved) -> Tensor:
        return packed if isinstance(packed, Tensor) else packed.load()

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield


class _Saved:
    """A tensor autograd saved, written to ``path``; the file goes with this object (when
    the backward pass has used it, or the graph is let go)."""

    def __init__(self, path: Path, tensor: Tensor) -> None:
        self.path, self.shape, self.dtype = path, tensor.shape, tensor.dtype
        torch.save(tensor.detach().contiguous(), path)

    def load(self) -> Tensor:
        tensor = torch.load(self.path, weights_only=True)
        if tensor.shape != self.shape or tensor.dtype != self.dtype:
            raise WorkbenchError(f"{self.path}: a saved tensor of {tuple(self.shape)} "
                                 f"{self.dtype} read back as {tuple(tensor.shape)} "
                                 f"{tensor.dtype}")
        return tensor

    def __del__(self) -> None:
        self.path.unlink(missing_ok=True)
