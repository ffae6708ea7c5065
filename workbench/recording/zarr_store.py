"""The Zarr v3 store of a recording: its arrays, their chunks and codecs, and the manifest.

A recording folder holds ``index.json`` (the manifest: prompts, shapes, the pattern storage,
and the size and SHA-256 of every file below) and one Zarr group ``recording.zarr`` with one
array per layer and kind, the prompt first::

    attn/L{l:03d}          dense patterns  [prompt, head_index, query_pos, key_pos]
    topk_weights/L{l:03d}  sparse patterns [prompt, head_index, query_pos, k]       float32
    topk_keys/L{l:03d}     their keys      [prompt, head_index, query_pos, k]       uint16/32
    exact/L{l:03d}         exact channels  [prompt, head_index, query_pos, channel] float32
    resid/B{b:03d}         residual stream [prompt, pos, d_model]

Prompts of different lengths are right-padded to the longest (the manifest keeps every
prompt's length); a chunk is one prompt and one block of :data:`QUERY_BLOCK` query rows (of
:data:`RESID_BLOCK` positions for the residual stream), so a reader of one prompt's window
touches only the chunks of its rows. Chunks that would hold only padding are never written
(Zarr's fill value stands for them). Every chunk is compressed (Blosc-zstd with byte
shuffling) and carries a CRC-32C (``zarr.codecs.Crc32cCodec``), so a damaged chunk fails
when it is read; the manifest's SHA-256 catches any change, and names the chunk file
(:func:`manifest_problem`).

The group is an ordinary Zarr v3 store: ``zarr.open_group(folder / "recording.zarr")`` (or
xarray/dask) reads it without the workbench.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, SuffixByteRequest
from zarr.codecs import BloscCodec, Crc32cCodec
from zarr.core.buffer import Buffer, BufferPrototype, default_buffer_prototype
from zarr.storage import LocalStore, MemoryStore

from workbench.core import checksums
from workbench.core.errors import ChecksumError, WorkbenchError
from workbench.core.files import read_bounded
from workbench.recording.index import FileEntry
from workbench.store.validate import confined_file

GROUP = "recording.zarr"
QUERY_BLOCK = 512
"""Query rows per pattern chunk: a 256-token zoom reads one or two chunks per layer."""
RESID_BLOCK = 2048
"""Positions per residual-stream chunk."""
DIMS = {
    "attn": ("prompt", "head_index", "query_pos", "key_pos"),
    "topk_weights": ("prompt", "head_index", "query_pos", "k"),
    "topk_keys": ("prompt", "head_index", "query_pos", "k"),
    "exact": ("prompt", "head_index", "query_pos", "channel"),
    "resid": ("prompt", "pos", "d_model"),
    "q": ("prompt", "head_index", "query_pos", "d_head"),
    "k": ("prompt", "kv_head", "key_pos", "d_head"),
    "lse": ("prompt", "head_index", "query_pos"),
    "first": ("prompt", "head_index", "query_pos"),
    "received": ("prompt", "head_index", "key_pos"),
}


def array_name(kind: str, layer: int) -> str:
    """The array of layer ``layer`` (boundary, for ``resid``) of ``kind`` in the group."""
    return f"{kind}/{'B' if kind == 'resid' else 'L'}{layer:03d}"


def create(group: zarr.Group, kind: str, layer: int, shape: tuple[int, ...],
           dtype: np.dtype | str, *, overwrite: bool = False) -> zarr.Array:
    """Create one array, chunked by prompt and by block of query rows (or positions).

    Args:
        group: the recording's group, open for writing.
        kind: a key of :data:`DIMS`.
        layer: the layer (boundary for ``resid``).
        shape: the full shape, prompt first.
        dtype: its dtype.
        overwrite: replace an array of that name (its chunks are deleted).

    Returns:
        The array, empty (every chunk at the fill value, none written).
    """
    if kind == "resid":
        chunks = (1, min(shape[1], RESID_BLOCK), shape[2])
    elif kind in ("lse", "first", "received"):
        chunks = (1, shape[1], min(shape[2], QUERY_BLOCK))
    else:
        chunks = (1, shape[1], min(shape[2], QUERY_BLOCK), shape[3])
    fill = np.iinfo(dtype).max if np.dtype(dtype).kind == "u" else 0
    return group.create_array(
        array_name(kind, layer), shape=shape, dtype=dtype, chunks=chunks, fill_value=fill,
        compressors=[BloscCodec(cname="zstd", clevel=3, shuffle="shuffle"), Crc32cCodec()],
        dimension_names=DIMS[kind], overwrite=overwrite,
    )


def file_manifest(root: Path) -> dict[str, dict[str, Any]]:
    """Size and SHA-256 of every file of the group in recording folder ``root``.

    Returns:
        ``{path relative to root: {"size", "sha256"}}``, sorted by path.
    """
    out = {}
    for folder, dirs, files in os.walk(root / GROUP):
        dirs.sort()
        for name in sorted(files):
            path = Path(folder) / name
            out[path.relative_to(root).as_posix()] = {
                "size": path.stat().st_size, "sha256": checksums.sha256_file(path)}
    return out


def check_files(root: Path, files: Mapping[str, FileEntry], *, what: str) -> None:
    """Every file the manifest lists is a regular file inside ``root`` of its listed size.

    The group is listed once (``os.scandir``, symlinks not followed), so a recording of
    thousands of chunks opens without resolving each path; a file not found as a plain
    file there (missing, a symlink, a special file) gets the full check of
    :func:`workbench.store.validate.confined_file`, which says what is wrong.

    Raises:
        WorkbenchError: a path that leads outside ``root`` or to something not a file.
        ChecksumError: a file missing or of another size (the message names it).
    """
    plain = {} if (root / GROUP).is_symlink() else _plain_files(root)
    for rel, entry in files.items():
        size = plain.get(rel)
        if size is None:
            size = confined_file(root, rel, what=what).stat().st_size
        if size != entry.size:
            raise ChecksumError(f"{root / rel} has {size} bytes, expected {entry.size}: "
                                "the recording is damaged")


def _plain_files(root: Path) -> dict[str, int]:
    """``{path relative to root: size}`` of the regular files (not symlinks) of the group,
    found without following any symlink."""
    out, stack = {}, [root / GROUP]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))
            elif entry.is_file(follow_symlinks=False):
                out[Path(entry.path).relative_to(root).as_posix()] = entry.stat(
                    follow_symlinks=False).st_size
    return out


def manifest_problem(root: Path, files: Mapping[str, FileEntry]) -> str | None:
    """The first file of the group whose SHA-256 differs from the manifest's, or that the
    manifest does not list (a chunk added later would be read as data), or ``None``."""
    for rel, entry in files.items():
        if checksums.sha256_file(root / rel) != entry.sha256:
            return f"checksum mismatch for chunk file {root / rel}"
    for folder, _, names in os.walk(root / GROUP):
        for name in names:
            rel = (Path(folder) / name).relative_to(root).as_posix()
            if rel not in files:
                return f"{root / rel} is not listed in the manifest"
    return None


class ConfinedStore(LocalStore):
    """The group's files, read only as the manifest lists them, checked at every read.

    Every key read must be a regular file (not a symlink, a FIFO or a device) inside the
    recording folder, opened without following a symlink, of its listed size; a listed file
    that is missing is an error (never the fill value); a file the manifest does not list is
    an error too (a chunk added later would be read as data). A chunk the writer never wrote
    (all padding) is neither listed nor present, and reads as the fill value. So what a
    reader is served is checked when it is read, not only when the recording was opened:
    a file replaced after that (a symlink out of the store, a FIFO) is refused.
    """

    def __init__(self, root: Path | str, *, files: Mapping[str, FileEntry] | None = None,
                 read_only: bool = True) -> None:
        super().__init__(root, read_only=read_only)
        self.files = dict(files or {})
        self._real = Path(os.path.realpath(self.root))

    def with_read_only(self, read_only: bool = False) -> ConfinedStore:
        return type(self)(self.root, files=self.files, read_only=read_only)

    async def get(self, key: str, prototype: BufferPrototype | None = None,
                  byte_range: ByteRequest | None = None) -> Buffer | None:
        if prototype is None:
            prototype = default_buffer_prototype()
        data = await asyncio.to_thread(self._read, key)
        if data is None:
            return None
        return prototype.buffer.from_bytes(_ranged(data, byte_range))

    async def get_partial_values(self, prototype: BufferPrototype,
                                 key_ranges: Any) -> list[Buffer | None]:
        return [await self.get(key, prototype, byte_range) for key, byte_range in key_ranges]

    def _read(self, key: str) -> bytes | None:
        """The bytes of file ``key`` (``None`` for a chunk never written), checked."""
        path, rel = self.root / key, f"{GROUP}/{key}"
        entry = self.files.get(rel)
        try:
            mode = os.lstat(path).st_mode
        except (FileNotFoundError, NotADirectoryError):
            if entry is not None:
                raise ChecksumError(f"{path} is missing: the recording is damaged") from None
            return None
        if entry is None:
            raise ChecksumError(f"{path} is not listed in the manifest: the recording is "
                                "damaged")
        if not stat.S_ISREG(mode) or not Path(os.path.realpath(path)).is_relative_to(
                self._real):
            raise WorkbenchError(f"{path} is not a regular file inside the recording")
        data = read_bounded(path, None, what="recording file", follow=False)
        if len(data) != entry.size:
            raise ChecksumError(f"{path} has {len(data)} bytes, expected {entry.size}: the "
                                "recording is damaged")
        # chunks carry a CRC-32C of their own; metadata is small, so it is hashed each read
        if key.endswith("zarr.json") and hashlib.sha256(data).hexdigest() != entry.sha256:
            raise ChecksumError(f"{path} changed since it was written: the recording is "
                                "damaged")
        return data


def _ranged(data: bytes, byte_range: ByteRequest | None) -> bytes:
    if byte_range is None:
        return data
    if isinstance(byte_range, RangeByteRequest):
        return data[byte_range.start:byte_range.end]
    if isinstance(byte_range, OffsetByteRequest):
        return data[byte_range.offset:]
    if isinstance(byte_range, SuffixByteRequest):
        return data[max(0, len(data) - byte_range.suffix):]
    raise TypeError(f"unexpected byte range {byte_range!r}")


def open_group(root: Path, files: Mapping[str, FileEntry]) -> zarr.Group:
    """The group of recording folder ``root``, read-only, through :class:`ConfinedStore`.

    Args:
        root: the recording folder.
        files: its manifest (``index.json``'s ``files``).

    Raises:
        WorkbenchError: no readable Zarr group there.
    """
    try:
        return zarr.open_group(store=ConfinedStore(root / GROUP, files=files), mode="r")
    except (FileNotFoundError, ValueError, KeyError, TypeError) as exc:
        raise WorkbenchError(f"{root / GROUP} is not a readable Zarr group ({exc}): "
                             "the recording is damaged") from None


def check_array(group: zarr.Group, kind: str, layer: int, shape: tuple[int, ...],
                dtypes: tuple[str, ...]) -> None:
    """The array exists, with the shape the manifest implies and exactly the metadata the
    writer writes for it (chunks, codecs, byte order, fill value, dimension names): an
    array whose metadata was edited, even re-hashed in the manifest, is not read as data.

    Args:
        group: the recording's group.
        kind: a key of :data:`DIMS`.
        layer: the layer (boundary for ``resid``).
        shape: the shape the manifest implies.
        dtypes: the dtypes the writer may have chosen (float16 widened to float32 when a
            value would overflow it).

    Raises:
        WorkbenchError: it is missing, or its metadata is not the writer's.
    """
    name = array_name(kind, layer)
    try:
        array = group[name]
    except (KeyError, FileNotFoundError, ValueError):
        raise WorkbenchError(f"array {name} is missing from {GROUP}: the recording is "
                             "damaged") from None
    if not isinstance(array, zarr.Array) or tuple(array.shape) != shape:
        got = getattr(array, "shape", "a group")
        raise WorkbenchError(f"array {name} of {GROUP} has shape {got}, expected {shape}: "
                             "the recording is damaged")
    found = array.metadata.to_dict()
    if str(found.get("data_type")) not in dtypes or found != _written(kind, layer, shape,
                                                                     found["data_type"]):
        raise WorkbenchError(f"array {name} of {GROUP} has metadata the writer does not "
                             "write (dtype, chunks, codecs or byte order): the recording is "
                             "damaged")


def _written(kind: str, layer: int, shape: tuple[int, ...], dtype: Any) -> dict[str, Any]:
    """The metadata :func:`create` writes for this array, made in memory."""
    group = zarr.open_group(store=MemoryStore(), mode="w")
    return create(group, kind, layer, shape, str(dtype)).metadata.to_dict()
