"""Safetensors checkpoints read and written one tensor at a time.

The export (:mod:`inactive_heads.pruning.export`) streams a checkpoint through these: it never
holds more than one tensor of it in memory, so exporting an 8B model beside the loaded one costs
a tensor, not a second copy. Files are read with ordinary reads, not memory-mapped: a mapping of
the source files would add every page it touches to the process's resident memory.

The format (one JSON header, then the raw little-endian bytes of each tensor) is written here
directly, shard by shard; the header of a shard is computed before its bytes from the shapes
alone (each tensor's transformation is first applied to a ``meta`` tensor). A tensor the
transformation leaves as it is (it returns its input itself) is copied from file to file in
chunks of :data:`COPY_BYTES`, never read whole: an 8B model's 1 GiB embedding costs a chunk.
"""

import json
import math
import os
import struct
from collections.abc import Callable
from pathlib import Path

import torch

from .errors import UserError

# safetensors dtype names <-> torch dtypes
DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
NAMES = {v: k for k, v in DTYPES.items()}
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# Shards of at most this many bytes (a larger single tensor gets a shard of its own).
SHARD_BYTES = 2 * 2**30
# Unchanged tensors are copied through a buffer of this many bytes.
COPY_BYTES = 16 * 2**20


def _header(path: Path) -> tuple[dict, int]:
    """A safetensors file's header (without ``__metadata__``) and where its data starts."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    header.pop("__metadata__", None)
    return header, 8 + size


class CheckpointReader:
    """The tensors of a Hugging Face folder's safetensors checkpoint (one file or an index of
    shards), each read on demand by :meth:`get` into its own memory."""

    def __init__(self, directory: str | os.PathLike):
        directory = Path(directory)
        index = directory / INDEX_FILE
        if index.is_file():
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        elif (directory / SINGLE_FILE).is_file():
            files = [SINGLE_FILE]
        else:
            raise UserError(f"{directory} holds no {SINGLE_FILE} or {INDEX_FILE}; the export reads safetensors "
                            "checkpoints (re-save the model with save_pretrained)")
        self.entries: dict[str, tuple[Path, int, dict]] = {}
        for name in files:
            header, start = _header(directory / name)
            for key, entry in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
                self.entries[key] = (directory / name, start, entry)

    def names(self) -> list[str]:
        """Tensor names in file order."""
        return list(self.entries)

    def meta(self, name: str) -> torch.Tensor:
        """A ``meta`` tensor of the stored shape and dtype (no data)."""
        _, _, entry = self.entries[name]
        return torch.empty(entry["shape"], dtype=DTYPES[entry["dtype"]], device="meta")

    def n_elements(self) -> int:
        """Elements of every tensor, from the headers alone."""
        return sum(math.prod(entry["shape"]) for _, _, entry in self.entries.values())

    def get(self, name: str) -> torch.Tensor:
        """The stored tensor, read from disk into memory of its own."""
        path, start, entry = self.entries[name]
        begin, end = entry["data_offsets"]
        dtype = DTYPES[entry["dtype"]]
        out = torch.empty(entry["shape"], dtype=dtype)
        if end > begin:
            with open(path, "rb") as f:
                f.seek(start + begin)
                view = memoryview(out.view(-1).view(torch.uint8).numpy())
                if f.readinto(view) != end - begin:
                    raise UserError(f"{path} is shorter than its header says ({name}); the checkpoint is damaged")
        return out

    def copy_to(self, name: str, f, buffer: memoryview) -> None:
        """Append the stored bytes of ``name`` to the open file ``f``, through ``buffer``."""
        path, start, entry = self.entries[name]
        begin, end = entry["data_offsets"]
        with open(path, "rb") as src:
            src.seek(start + begin)
            left = end - begin
            while left:
                n = src.readinto(buffer[:min(left, len(buffer))])
                if not n:
                    raise UserError(f"{path} is shorter than its header says ({name}); the checkpoint is damaged")
                f.write(buffer[:n])
                left -= n


Transform = Callable[[str, torch.Tensor], list[tuple[str, torch.Tensor]]]


def _shards(specs: list[tuple[str, str, torch.Tensor]], limit: int) -> list[list[tuple[str, str, torch.Tensor]]]:
    shards: list[list] = [[]]
    size = 0
    for spec in specs:
        nbytes = spec[2].numel() * spec[2].element_size()
        if shards[-1] and size + nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += nbytes
    return shards


def write_checkpoint(reader: CheckpointReader, transform: Transform, out: str | os.PathLike, *,
                     shard_bytes: int | None = None) -> list[str]:
    """Write ``transform`` of every tensor of ``reader`` to safetensors shards in ``out``; returns
    the file names written.

    ``transform(name, tensor)`` returns the ``(name, tensor)`` pairs to write for one source
    tensor (none to drop it, a new name to rename it). It is run on a ``meta`` tensor first to
    learn the shapes (the shard headers come first in the file). When it returns its input itself,
    as its only output, the tensor is unchanged: its bytes are copied from the source in chunks and
    ``transform`` is not run on the data (a transform that edits in place must return a new tensor).
    Otherwise it is run again on the data, read whole.
    Shards hold at most ``shard_bytes`` (default :data:`SHARD_BYTES`) unless one tensor is larger.
    """
    out = Path(out)
    shard_bytes = SHARD_BYTES if shard_bytes is None else shard_bytes
    specs, unchanged = [], set()
    for src in reader.names():
        meta = reader.meta(src)
        outputs = transform(src, meta)
        if len(outputs) == 1 and outputs[0][1] is meta:
            unchanged.add(src)
        specs += [(src, new, t) for new, t in outputs]
    shards = _shards(specs, shard_bytes)
    if len(shards) == 1:
        files = [SINGLE_FILE]
    else:
        files = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map = {}
    for file, shard in zip(files, shards, strict=True):
        _write_shard(out / file, shard, reader, transform, unchanged)
        weight_map.update({new: file for _, new, _ in shard})
    if len(files) > 1:
        total = sum(t.numel() * t.element_size() for _, _, t in specs)
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return files


def _write_shard(path: Path, shard, reader: CheckpointReader, transform: Transform, unchanged: set[str]) -> None:
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for _, new, t in shard:
        nbytes = t.numel() * t.element_size()
        header[new] = {"dtype": NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    wanted = {new: t for _, new, t in shard}
    buffer = memoryview(bytearray(COPY_BYTES))
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for src in dict.fromkeys(s for s, _, _ in shard):  # each source tensor read once
            if src in unchanged:
                reader.copy_to(src, f, buffer)
                continue
            for new, tensor in transform(src, reader.get(src)):
                if new not in wanted:
                    continue
                spec = wanted[new]
                if tensor.shape != spec.shape or tensor.dtype != spec.dtype:
                    raise RuntimeError(f"{new}: {tuple(tensor.shape)} {tensor.dtype}, its header says "
                                       f"{tuple(spec.shape)} {spec.dtype}")
                if tensor.numel():
                    f.write(memoryview(tensor.contiguous().view(-1).view(torch.uint8).numpy()))

