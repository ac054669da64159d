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
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"  # auto: bf16 on GPU, fp32 on CPU
    microbatch_size: int = 128  # sequences per forward/backward per process; train.batch_size is reached by accumulation
    threads: int | None = None  # torch CPU threads (None: torch's default)
    tf32: bool = True  # TF32 matmuls on Ampere+ GPUs (fp32 stays exact on CPU)
    data_cache: str = "outputs/data"  # where prepared data is cached, keyed by the data config
    progress: bool = True  # progress bars
    dryrun_steps: int = 4  # optimizer steps taken when dryrun=true
    # --- speed
    compile: bool | Literal["auto"] = "auto"  # torch.compile the training model (auto: on one CUDA device, see compile_model)
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
    if impl.threads:
        torch.set_num_threads(impl.threads)
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


def autocast_dtype(impl: ImplConfig, device: torch.device) -> torch.dtype | None:
    precision = impl.precision
    if precision == "auto":
        precision = "bf16" if device.type == "cuda" else "fp32"
    return PRECISION_DTYPES[precision]


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
    """torch.compile (inductor). ``compile=auto`` compiles where it pays and is proven: a model on a
    CUDA device that no DDP/FSDP wrapper holds; on a CPU, inductor's minutes of C++ code generation
    rarely pay back within a budget, so the model is returned as it is."""
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
    if impl.compile == "auto" and not _compiles_by_default(model):
        return model
    return torch.compile(model, mode=impl.compile_mode)


def _compiles_by_default(model: torch.nn.Module) -> bool:
    param = next(model.parameters(), None)
    wrapped = isinstance(model, torch.nn.parallel.DistributedDataParallel) or any(
        type(m).__name__.startswith("FSDP") for m in model.modules())  # fully_shard makes FSDP<Class> types
    return param is not None and param.device.type == "cuda" and not wrapped
