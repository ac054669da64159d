"""Implementation settings (the ``impl`` group): device, precision, compile, parallelism, logging.

Nothing here changes the maths of a run (up to floating-point rounding): the same ``arch``/``train``
config trains the same model on a laptop CPU or on many GPUs."""

from __future__ import annotations

import contextlib
from typing import Any, Literal

import torch

from cramlm.config.base import Config


class ImplConfig(Config):
    device: str = "auto"  # auto: cuda if available, else cpu
    # auto: bf16 on a GPU with bf16; on a CPU bf16 autocast where a short probe measures it faster (train/hardware.py)
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    microbatch_size: int = 128  # sequences per forward/backward per process; train.batch_size is reached by accumulation
    threads: int | Literal["auto"] | None = "auto"  # torch CPU threads; auto: the CPUs affinity and cgroup quota allow, per local process; None: torch's default
    tf32: bool = True  # TF32 matmuls on Ampere+ GPUs (fp32 stays exact on CPU)
    data_cache: str = "outputs/data"  # where prepared data is cached, keyed by the data config
    progress: bool = True  # progress bars
    dryrun_steps: int = 4  # optimizer steps taken when dryrun=true
    # --- speed
    compile: bool = False  # torch.compile the training model
    compile_mode: str | None = None  # e.g. "max-autotune", "reduce-overhead"
    inductor: dict[str, Any] = {}  # torch._inductor.config options, e.g. {coordinate_descent_tuning: true}
    activation_checkpointing: bool = False  # recompute each block (every child of an nn.ModuleList) in backward
    # --- parallelism (launch with torchrun; see docs/training.md)
    distributed: Literal["auto", "none", "ddp", "fsdp"] = "auto"  # auto: ddp when WORLD_SIZE > 1
    dist_timeout: float = 300.0  # seconds a collective may wait for a dead or stuck rank before failing
    # --- logging
    tensorboard: bool = False  # also write TensorBoard scalars to <run>/tensorboard (needs `tensorboard`)
    wandb: bool = False  # also log to Weights & Biases (needs `wandb`)
    wandb_mode: Literal["offline", "online"] = "offline"
    wandb_project: str = "cramlm"


def setup_device(impl: ImplConfig, local_rank: int | None = None) -> torch.device:
    from cramlm.train.hardware import resolve_threads

    threads = resolve_threads(impl.threads)
    if threads:
        torch.set_num_threads(threads)
    name = impl.device
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and local_rank is not None:
        name = f"cuda:{local_rank}"
    device = torch.device(name)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = impl.tf32
        torch.backends.cudnn.allow_tf32 = impl.tf32
    return device


PRECISION_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}  # None: no autocast


def resolve_precision(impl: ImplConfig, device: torch.device, model: torch.nn.Module | None = None):
    """The precision in use and why (``auto``: measured once per machine, see train/hardware.py)."""
    from cramlm.train.hardware import resolve_precision as choose

    return choose(impl.precision, device, model)


def autocast_dtype(impl: ImplConfig, device: torch.device, model: torch.nn.Module | None = None) -> torch.dtype | None:
    return PRECISION_DTYPES[resolve_precision(impl, device, model).precision]


def autocast(device: torch.device, dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def apply_activation_checkpointing(model: torch.nn.Module) -> int:
    """Wrap every child of every nn.ModuleList (the transformer blocks, whatever the model) so its
    activations are recomputed in backward. Applied from outside: the model code stays plain."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing as apply

    blocks = {id(b) for m in model.modules() if isinstance(m, torch.nn.ModuleList) for b in m}
    apply(model, check_fn=lambda m: id(m) in blocks)
    return len(blocks)


def compile_model(model: torch.nn.Module, impl: ImplConfig) -> torch.nn.Module:
    if impl.inductor:
        import torch._inductor.config as inductor_config

        for key, value in impl.inductor.items():  # dotted keys reach sub-configs: triton.cudagraphs
            *parents, leaf = key.split(".")
            node = inductor_config
            for part in parents:
                node = getattr(node, part)
            if not hasattr(node, leaf):
                raise ValueError(f"impl.inductor.{key}: no such torch._inductor.config option")
            setattr(node, leaf, value)
    return torch.compile(model, mode=impl.compile_mode)
