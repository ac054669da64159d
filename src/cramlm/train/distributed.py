"""Data parallelism under ``torchrun``: DDP or FSDP2 (``fully_shard``), gloo on CPU, NCCL on GPU.

Each process draws and collates only its own microbatches of the global batch, masks keyed by
stream position (train/batches.py), so a run's maths does not depend on the number of processes. Collectives time out after ``impl.dist_timeout``
seconds, so a dead rank makes the others fail instead of hanging.
"""

from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from cramlm.models.base import tied_aliases
from cramlm.train.impl import ImplConfig, launcher_env


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    strategy: str = "none"  # none | ddp | fsdp
    owns_group: bool = False  # this Dist created the process group (and destroys it at the end)

    @property
    def enabled(self) -> bool:
        return self.strategy != "none"

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def sharded(self) -> bool:
        """FSDP2 over several processes: each holds only its shards of weights and optimizer state."""
        return self.strategy == "fsdp" and self.world > 1


def init_distributed(impl: ImplConfig) -> Dist:
    """Join the process group set up by torchrun (RANK, WORLD_SIZE, MASTER_ADDR... in the env)."""
    _, local_rank, world = launcher_env()
    strategy = impl.distributed
    if strategy == "auto":
        strategy = "ddp" if world > 1 else "none"
    if strategy == "none":
        if world > 1:
            raise ValueError(f"impl.distributed=none but WORLD_SIZE={world}")
        return Dist()
    owns_group = not dist.is_initialized()  # a caller's group (e.g. several runs in one job) is reused
    if owns_group:
        use_cuda = torch.cuda.is_available() and impl.device in ("auto", "cuda")
        backend = "nccl" if use_cuda else "gloo"
        # device_id binds the group to this process's GPU: NCCL forms its communicator now (errors
        # surface here, not in the first collective) and barrier() knows the device
        device_id = {"device_id": torch.device("cuda", local_rank)} if use_cuda else {}
        if use_cuda:
            torch.cuda.set_device(local_rank)
        dist.init_process_group(backend, timeout=timedelta(seconds=impl.dist_timeout), **device_id)
    return Dist(dist.get_rank(), dist.get_world_size(), local_rank, strategy, owns_group)


def shutdown(d: Dist, ok: bool = True) -> None:
    if d.owns_group:
        close_process_group(ok)


def close_process_group(ok: bool = True) -> None:
    """Tear the group down in step: free the finished models (DDP reducers and FSDP states hold
    gloo work objects; freed at interpreter exit they can abort the process), wait for every rank
    (only after success: after an error the others may sit in another collective), then destroy.
    Without this a successful run could end with 'terminate called without an active exception'
    and a failed exit status."""
    if dist.is_initialized():
        gc.collect()
        if ok:
            dist.barrier()
        dist.destroy_process_group()


def wrap_model(model: nn.Module, d: Dist, device: torch.device, from_rank0: bool = True) -> nn.Module:
    """DDP: one replica per process, gradients all-reduced in buckets during backward.
    FSDP2: each child of an nn.ModuleList (a transformer block) and then the root is sharded, each
    moved to ``device`` as it is; then, with ``from_rank0``, every process takes its shards of rank
    0's weights (ranks > 0 may have built their model on the meta device: cramlm.run.pretrain does)."""
    if d.strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if d.strategy == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device.type, (d.world,))
        # rank 0's weights are the run's (ranks > 0 may have built theirs on the meta device): kept
        # on its host until each process has its shards of them; a resume from a sharded checkpoint
        # builds every process on the meta device (the weights come from the shards)
        aliases = tied_aliases(model)  # a tied weight is loaded under its one canonical name
        if from_rank0 and d.sharded:
            from_rank0 = broadcast_object(not any(p.is_meta for p in model.parameters()) if d.main else None, d)
        full = ({k: v for k, v in model.state_dict().items() if k not in aliases} if d.main else {}) \
            if from_rank0 and d.sharded else None
        # fully_shard cannot shard 0-dim parameters (e.g. a learned scalar scale): they stay
        # replicated and `sync_replicated_grads` averages their gradients; FSDP2 does not move them
        scalars = {p for p in model.parameters() if p.ndim == 0}
        for p in scalars:
            if not p.is_meta:  # (meta ones: allocated with the rest below, values from rank 0)
                p.data = p.data.to(device)
        # each fully_shard moves its module's parameters to the mesh's device and shards them there,
        # block by block: a model on the host never has to fit one device whole
        for m in list(model.modules()):
            if isinstance(m, nn.ModuleList):
                for block in m:
                    fully_shard(block, mesh=mesh, ignored_params=scalars & set(block.parameters()) or None)
        fully_shard(model, mesh=mesh, ignored_params=scalars or None)  # the rest, buffers too
        if full is not None:
            if any(t.is_meta for t in [*model.parameters(), *model.buffers()]):
                model.to_empty(device=device)  # this process's shards only
            load_from_rank0(model, full, aliases)
            for b in model.buffers():  # non-persistent ones (rotary frequencies, sinusoid tables): not in a state dict
                dist.broadcast(b.data, src=0)
        elif d.sharded and any(t.is_meta for t in [*model.parameters(), *model.buffers()]):
            model.to_empty(device=device)  # this process's shards, filled by the checkpoint's
            for m in model.modules():  # non-persistent buffers, computed again where they live
                if hasattr(m, "reset_buffers"):
                    m.reset_buffers()
                elif m._non_persistent_buffers_set:  # no checkpoint holds them: a model must say how
                    raise RuntimeError(f"{type(m).__name__} has non-persistent buffers "
                                       f"{sorted(m._non_persistent_buffers_set)} and no reset_buffers() to compute "
                                       "them on a model built on the meta device (a resume from a sharded checkpoint)")
    return model


def buffers_recomputable(model: nn.Module) -> bool:
    """Every module holding non-persistent buffers (which no checkpoint holds) can compute them again
    (``reset_buffers()``), so the model may be built on the meta device and filled from a checkpoint."""
    return all(hasattr(m, "reset_buffers") or not m._non_persistent_buffers_set for m in model.modules())


def load_from_rank0(model: nn.Module, full: dict, aliases: dict[str, str]) -> None:
    """Every process's shards from rank 0's ``full`` state (the others pass {}), broadcast tensor by
    tensor, so that no process but rank 0 holds the whole model (a process that built its model on
    the meta device has only allocated its shards). A tied weight comes under its canonical name
    only; anything else missing is an error."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    full = {k: v for k, v in full.items() if k not in aliases}
    keys = set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True,
                                                                     strict=False))
    missing = sorted(set(keys.missing_keys) - set(aliases))
    if missing or keys.unexpected_keys:
        raise RuntimeError(f"FSDP2 state from rank 0: missing {missing[:5]}, unexpected {sorted(keys.unexpected_keys)[:5]}")


def sync_replicated_grads(model: nn.Module, d: Dist) -> None:
    """Average the gradients FSDP2 left alone (its ignored, replicated parameters)."""
    if d.strategy != "fsdp":
        return
    from torch.distributed.tensor import DTensor

    for p in model.parameters():
        if p.grad is not None and not isinstance(p, DTensor):
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG if dist.get_backend() == "nccl" else dist.ReduceOp.SUM)
            if dist.get_backend() != "nccl":
                p.grad /= d.world


def gradient_sync(model: nn.Module, d: Dist, sync: bool):
    """Accumulate without communicating: DDP's no_sync, FSDP2's set_requires_gradient_sync."""
    if d.strategy == "ddp" and not sync:
        return model.no_sync()
    if d.strategy == "fsdp":
        model.set_requires_gradient_sync(sync)
    return contextlib.nullcontext()


def all_reduce(values: list, d: Dist, op: str = "sum", device: torch.device | None = None) -> list[float]:
    """Reduce a few numbers over all processes (one small collective); the values may be Python
    numbers or scalar tensors (e.g. a flag computed on the GPU). Reading the result is a host
    synchronisation; with one process the values come back as they are."""
    if not d.enabled:
        return values
    backend_device = device if dist.get_backend() == "nccl" else torch.device("cpu")
    t = torch.stack([torch.as_tensor(v).to(backend_device, torch.float64).reshape(()) for v in values])
    dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op])
    return t.tolist()


def barrier(d: Dist) -> None:
    if d.enabled:
        dist.barrier()


def broadcast_object(obj, d: Dist):
    if not d.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_object(obj, d: Dist) -> list:
    """Every rank's ``obj``, in rank order, on every rank."""
    if not d.enabled:
        return [obj]
    out = [None] * d.world
    dist.all_gather_object(out, obj)
    return out


def on_main(fn, d: Dist):
    """``fn()`` run on rank 0 alone, its result on every rank; what it raises there is raised on every
    rank (the same exception), so that no rank is left waiting in a collective for one that stopped:
    each then exits with the same ``Error:`` line instead of a broken connection's traceback."""
    if not d.enabled:
        return fn()
    outcome = None
    if d.main:
        try:
            outcome = (True, fn())
        except BaseException as e:  # noqa: BLE001 - handed to every rank, raised there (a Ctrl-C or exit too)
            outcome = (False, e)
    done, value = broadcast_object(outcome, d)
    if not done:
        raise value
    return value
