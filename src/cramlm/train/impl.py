"""Implementation settings (the ``impl`` group): device, precision, compile, parallelism, logging.

Nothing here changes the maths of a run (up to floating-point rounding): the same ``arch``/``train``
config trains the same model on a laptop CPU or on many GPUs."""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator

from cramlm.config.base import Config, PositiveFloat, PositiveInt
from cramlm.config.loader import ConfigError

if TYPE_CHECKING:
    import torch


class ImplConfig(Config):
    device: str = Field(
        "auto", description="auto: cuda if available, else cpu; or a torch device: cpu, cuda, cuda:1, mps"
    )
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto", description="auto: bf16 on a GPU with bf16; on a CPU bf16 autocast where a short probe "
        "measures it faster (train/hardware.py)")
    microbatch_size: PositiveInt = Field(
        128, description="sequences per forward/backward per process; train.batch_size is reached by accumulation"
    )
    threads: PositiveInt | Literal["auto"] | None = Field(
        "auto", description="torch CPU threads; auto: the CPUs affinity and cgroup quota allow, per local "
        "process; None: torch's default")
    tf32: bool = Field(True, description="TF32 matmuls on Ampere+ GPUs (fp32 stays exact on CPU)")
    data_cache: str | None = Field(
        None, description="where prepared data is cached, keyed by the data config (null: per user, data/prepare.py)"
    )
    progress: bool = Field(True, description="progress bars")
    dryrun_steps: PositiveInt = Field(4, description="optimizer steps taken when dryrun=true")
    # --- speed
    compile: bool | Literal["auto"] = Field(
        "auto", description="torch.compile the training model (auto: on one CUDA device, see compile_model)"
    )
    compile_mode: str | None = Field(None, description='e.g. "max-autotune", "reduce-overhead"')
    inductor: dict[str, Any] = Field(
        {}, description="torch._inductor.config options, e.g. {coordinate_descent_tuning: true}"
    )
    activation_checkpointing: bool = Field(
        False, description="recompute each block (every child of an nn.ModuleList) in backward"
    )
    prefetch: bool | Literal["auto"] = Field(
        "auto", description="prepare the next microbatch (draw, mask, pin) in a background thread while the "
        "device computes; auto: on with CUDA, off on a CPU, where the thread takes cores from the computation "
        "(train/batches.py); metrics.jsonl logs the host time per step either way")
    # --- parallelism (launch with torchrun; see docs/training.md)
    distributed: Literal["auto", "none", "ddp", "fsdp"] = Field("auto", description="auto: ddp when WORLD_SIZE > 1")
    dist_timeout: PositiveFloat = Field(
        300.0, description="seconds a collective may wait for a dead or stuck rank before failing"
    )
    # --- logging
    tensorboard: bool = Field(
        False, description="also write TensorBoard scalars to <run>/tensorboard (needs `tensorboard`)"
    )
    wandb: bool = Field(False, description="also log to Weights & Biases (needs `wandb`)")
    wandb_mode: Literal["offline", "online"] = "offline"
    wandb_project: str = "cramlm"

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if value != "auto":
            import torch  # only for a named device: ImplConfig validates without torch

            try:
                torch.device(value)
            except (RuntimeError, ValueError):
                raise ValueError("not a torch device: use auto, cpu, cuda, cuda:<index> or mps") from None
        return value


def setup_device(impl: ImplConfig, local_rank: int | None = None) -> torch.device:
    import torch  # here, not at the top: ImplConfig validates without torch

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
    check_available(device, impl.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = impl.tf32
        torch.backends.cudnn.allow_tf32 = impl.tf32
    return device


def check_available(device: torch.device, key: str) -> None:
    """A clear error, before any work, for a device this machine does not have."""
    import torch

    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"impl.device={key}: this machine has no CUDA device (torch.cuda.is_available() is false); "
                              "use impl.device=auto or impl.device=cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"impl.device={key}: no CUDA device {device.index} (this machine has {torch.cuda.device_count()})")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"impl.device={key}: MPS (Apple GPU) is not available here; use impl.device=auto or impl.device=cpu")


def __getattr__(name: str) -> Any:
    # PRECISION_DTYPES holds torch dtypes: built on first use, so that importing ImplConfig needs no torch
    if name == "PRECISION_DTYPES":
        return _precision_dtypes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _precision_dtypes() -> dict[str, torch.dtype | None]:
    import torch

    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}  # None: no autocast


def launcher_env() -> tuple[int, int, int]:
    """(RANK, LOCAL_RANK, WORLD_SIZE) as torchrun sets them; (0, 0, 1) in a plain process. Read
    without torch, so the pipeline knows which process writes before it imports torch."""
    env = os.environ
    return int(env.get("RANK", "0")), int(env.get("LOCAL_RANK", "0")), int(env.get("WORLD_SIZE", "1"))


def resolve_precision(impl: ImplConfig, device: torch.device, model: torch.nn.Module | None = None):
    """The precision in use and why (``auto``: measured once per machine, see train/hardware.py)."""
    from cramlm.train.hardware import resolve_precision as choose

    return choose(impl.precision, device, model)


def autocast_dtype(impl: ImplConfig, device: torch.device, model: torch.nn.Module | None = None) -> torch.dtype | None:
    return _precision_dtypes()[resolve_precision(impl, device, model).precision]


def autocast(device: torch.device, dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    import torch

    return torch.autocast(device_type=device.type, dtype=dtype)


def apply_activation_checkpointing(model: torch.nn.Module) -> int:
    """Wrap every child of every nn.ModuleList (the transformer blocks, whatever the model) so its
    activations are recomputed in backward. Applied from outside: the model code stays plain."""
    import torch
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing as apply

    blocks = {id(b) for m in model.modules() if isinstance(m, torch.nn.ModuleList) for b in m}
    apply(model, check_fn=lambda m: id(m) in blocks)
    return len(blocks)


def compile_model(model: torch.nn.Module, impl: ImplConfig) -> torch.nn.Module:
    """torch.compile (inductor). ``compile=auto`` compiles where it pays and is proven: a model on a
    CUDA device that no DDP/FSDP wrapper holds; on a CPU, inductor's minutes of C++ code generation
    rarely pay back within a budget, so the model is returned as it is."""
    import torch

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
    import torch

    param = next(model.parameters(), None)
    wrapped = isinstance(model, torch.nn.parallel.DistributedDataParallel) or any(
        type(m).__name__.startswith("FSDP") for m in model.modules())  # fully_shard makes FSDP<Class> types
    return param is not None and param.device.type == "cuda" and not wrapped
