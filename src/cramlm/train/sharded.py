"""Sharded checkpoints (``impl.checkpoint_format=sharded``, the default under FSDP2) with
torch.distributed.checkpoint (DCP): every process writes its own shards of the model and optimizer
state, in parallel, and no process ever holds the whole of either. A checkpoint folder
``step-00000042/`` then holds

- ``__<rank>_0.distcp``: each process's shards (DCP's files: tensors only, each a ``torch.save``
  record that DCP reads back with the weights-only loader);
- ``.metadata``: DCP's index (which file holds which chunk of which tensor, the tensors' global
  shapes). A pickle: read only after every file matched its digest, and then by
  ``MetadataUnpickler``, which admits DCP's own record classes and nothing else;
- ``training.pt``, ``state.json``, ``digests.json`` as in a full checkpoint (checkpoint.py), with the
  optimizer's non-tensor state (param groups, ...) in ``training.pt``: DCP would pickle it into the
  shards and read it back with ``torch.load(weights_only=False)``, which runs code.

Any number of processes, in any layout (FSDP2, DDP, one), loads it: DCP reads the chunks each
process's own shards overlap (resharding). ``stream_weights`` assembles the full weights on one
process tensor by tensor (the run's final ``model.safetensors``; ``cramlm export``, ``cramlm
eval``), never reading the optimizer's bytes.
"""

from __future__ import annotations

import json
import pickle
import struct
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

from cramlm.io import atomic_write, file_digest, umask

METADATA = ".metadata"  # DCP's index file
SHARDS = "*.distcp"
MODEL, OPTIM = "model", "optim"  # the two parts of the DCP state dict: keys model.<name>, optim.state.<name>.<key>


def is_sharded(folder: Path) -> bool:
    """A checkpoint folder in the sharded format (its DCP index or any shard is there)."""
    return (folder / METADATA).is_file() or any(folder.glob(SHARDS))


def shard_files(folder: Path) -> list[str]:
    """The DCP files of a sharded checkpoint folder: the index and every process's shards."""
    return sorted([METADATA] * (folder / METADATA).is_file() + [p.name for p in folder.glob(SHARDS)])


# ------------------------------------------------------------------ the index, without running code


class MetadataUnpickler(pickle.Unpickler):
    """DCP's ``.metadata`` with an allowlist: its own record classes, torch.Size, dtypes and
    layouts, and the path it was written to; any other global is refused (UnpicklingError)."""

    ALLOWED = {
        "torch.distributed.checkpoint.metadata": {"Metadata", "MetadataIndex", "StorageMeta", "TensorProperties",
                                                  "TensorStorageMetadata", "ChunkStorageMetadata",
                                                  "BytesStorageMetadata", "_MEM_FORMAT_ENCODING"},
        "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
        "torch.serialization": {"_get_layout"},
        "pathlib": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"},
        "collections": {"OrderedDict"},
    }

    def find_class(self, module: str, name: str):
        if name in self.ALLOWED.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and (name == "Size" or isinstance(getattr(torch, name, None), torch.dtype)):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{METADATA}: refused global {module}.{name} (not one of DCP's record types)")


def read_metadata(folder: Path):
    """DCP's index of ``folder`` (torch's ``Metadata``), through ``MetadataUnpickler``."""
    with open(folder / METADATA, "rb") as f:
        return MetadataUnpickler(f).load()


class VettedReader(FileSystemReader):
    """DCP's file reader with the index read by ``MetadataUnpickler`` (once per reader)."""

    def __init__(self, folder: Path):
        super().__init__(folder)
        self.folder, self.metadata = Path(folder), None

    def read_metadata(self, *args, **kwargs):
        if self.metadata is None:
            from torch.distributed.checkpoint.metadata import StorageMeta

            self.metadata = read_metadata(self.folder)
            self.metadata.storage_meta = StorageMeta(load_id=self.load_id)
        return self.metadata


def index_problem(folder: Path, names: set[str]) -> str | None:
    """What is wrong with the index of a sharded checkpoint whose files (``names``) matched their
    digests: unreadable, refused, naming a shard file that is not there, or holding no weights."""
    try:
        metadata = read_metadata(folder)
    except pickle.UnpicklingError as e:
        return str(e)[:200]
    except Exception as e:
        return f"{METADATA}: unreadable ({type(e).__name__}: {str(e)[:160]})"
    missing = sorted({info.relative_path for info in metadata.storage_data.values()} - names)
    if missing:
        return f"{METADATA} names shard files that are not there: {', '.join(missing[:3])}"
    if not any(k.startswith(MODEL + ".") for k in metadata.state_dict_metadata):
        return f"{METADATA}: no model weights in this checkpoint"
    return None


def weight_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """{weight name: global shape} of a sharded checkpoint (from its index)."""
    return {k[len(MODEL) + 1:]: tuple(md.size) for k, md in _tensors(read_metadata(folder)).items() if k.startswith(MODEL + ".")}


def _tensors(metadata) -> dict:
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    return {k: md for k, md in metadata.state_dict_metadata.items() if isinstance(md, TensorStorageMetadata)}


# ------------------------------------------------------------------ writing and reading shards


def split_tensors(tree: dict) -> tuple[dict, dict]:
    """(the tensors of a nested dict, everything else), each keeping the nesting; lists (param
    groups) go whole to the second."""
    tensors, rest = {}, {}
    for key, value in tree.items():
        if isinstance(value, dict):
            t, r = split_tensors(value)
            if t:
                tensors[key] = t
            if r or not t:
                rest[key] = r
        elif isinstance(value, torch.Tensor):
            tensors[key] = value
        else:
            rest[key] = value
    return tensors, rest


def merge(tensors: dict, rest: dict) -> dict:
    """``split_tensors`` undone."""
    out = dict(rest)
    for key, value in tensors.items():
        out[key] = merge(value, out.get(key, {})) if isinstance(value, dict) else value
    return out


class ShardError(RuntimeError):
    """DCP failed on some process: its CheckpointException (a BaseException) as an ordinary error,
    naming the first process's failure."""


@contextmanager
def _dcp() -> Iterator[None]:
    """A DCP call: its failure as ``ShardError``; no warning that a process without a process group
    saves or loads alone (that is the intent)."""
    from torch.distributed.checkpoint.api import CheckpointException

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to (save|load) in a single process.*")
        try:
            yield
        except CheckpointException as e:
            rank, (exc, _) = min(e.failures.items())
            raise ShardError(f"process {rank}: {type(exc).__name__}: {exc}") from exc


def save_shards(folder: Path, model_state: dict, optim_tensors: dict) -> None:
    """Every process: its shards of ``model_state`` and of the optimizer's tensors into ``folder``
    (a collective under a process group; rank 0 writes the index last)."""
    import torch.distributed.checkpoint as dcp

    writer = FileSystemWriter(folder, single_file_per_rank=True, sync_files=True, thread_count=1)
    with _dcp():
        dcp.save({MODEL: model_state, OPTIM: optim_tensors}, storage_writer=writer, no_dist=not dist.is_initialized())


def own_shard_digests(folder: Path) -> dict[str, str]:
    """{file: digest} of this process's shard files (``__<rank>_*.distcp``), so that the processes
    digest theirs in parallel; rank 0 learns all of them (a collective under a process group)."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    mine = {p.name: file_digest(p) for p in folder.glob(f"__{rank}_*.distcp")}
    if not dist.is_initialized():
        return mine
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return {k: v for part in gathered for k, v in part.items()}


def load_shards(folder: Path, model_state: dict, optim_tensors: dict) -> None:
    """Fill ``model_state`` and ``optim_tensors`` (this process's tensors, in its own layout) in place
    from ``folder``: every process reads the chunks its tensors overlap."""
    import torch.distributed.checkpoint as dcp

    with _dcp():
        dcp.load({MODEL: model_state, OPTIM: optim_tensors}, storage_reader=VettedReader(folder),
                 no_dist=not dist.is_initialized())


# ------------------------------------------------------------------ full weights on one process

SAFETENSORS_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
                      torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
                      torch.uint8: "U8", torch.bool: "BOOL"}


def weight_entries(folder: Path, rename: Callable[[str], str | None] | None = None) -> list[tuple[str, str, object]]:
    """[(DCP key, name in the output, its storage metadata)] of the weights, sorted by output name;
    ``rename`` maps a weight name to the output's (None: left out)."""
    entries = []
    for key, md in _tensors(read_metadata(folder)).items():
        if not key.startswith(MODEL + "."):
            continue
        name = key[len(MODEL) + 1:]
        name = rename(name) if rename else name
        if name is not None:
            entries.append((key, name, md))
    return sorted(entries, key=lambda e: e[1])


def read_weight(reader: VettedReader, key: str, md) -> torch.Tensor:
    """One full weight, assembled from the chunks of every shard that holds part of it."""
    import torch.distributed.checkpoint as dcp

    tensor = torch.empty(tuple(md.size), dtype=md.properties.dtype)
    with _dcp():
        dcp.load({key: tensor}, storage_reader=reader, no_dist=True)
    return tensor


def iter_weights(folder: Path, rename: Callable[[str], str | None] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full weight) of a sharded checkpoint, one at a time; the optimizer's shards are never read."""
    reader = VettedReader(folder)
    for key, name, md in weight_entries(folder, rename):
        yield name, read_weight(reader, key, md)


def full_weights(folder: Path, rename: Callable[[str], str | None] | None = None) -> dict[str, torch.Tensor]:
    """The full weights of a sharded checkpoint on this process (for a model that is built whole
    anyway: export, evaluation)."""
    return dict(iter_weights(folder, rename))


def stream_weights(folder: Path, path: Path, rename: Callable[[str], str | None] | None = None) -> int:
    """Write the full weights of a sharded checkpoint to the safetensors file ``path``, one tensor
    at a time (this process never holds more than the largest weight); the number of tensors."""
    entries = weight_entries(folder, rename)
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for _, name, md in entries:
        n = md.properties.dtype.itemsize * int(torch.Size(md.size).numel())
        header[name] = {"dtype": SAFETENSORS_DTYPES[md.properties.dtype], "shape": list(md.size),
                        "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    with atomic_write(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            for _, tensor in iter_weights(folder, rename):  # (the same order: weight_entries')
                f.write(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
        tmp.chmod(0o666 & ~umask())
    return len(entries)
