"""Implementation settings (the ``impl`` group): device, precision, compile, parallelism, logging;
the device and the precision they resolve to (the ``auto`` probe itself: train/hardware.py).
Compilation and activation checkpointing are applied from outside the model by train/parallelize.py.

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
        None, description="where cramlm pretrain and cramlm run cache prepared data, keyed by the data config (null: per user, "
        "data/prepare.py); cramlm eval finds a run's validation file where that run's own config put it"
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
    document_attention_kernel: Literal["auto", "flex", "dense"] = Field(
        "auto", description="how attention keeps packed documents apart (train.document_attention=true): auto = "
        "FlexAttention's block mask on CUDA for sequences longer than its 128-token block (shorter: nothing to skip), "
        "the dense SDPA mask elsewhere; flex / dense force one (same results)")
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
    checkpoint_format: Literal["auto", "full", "sharded"] = Field(
        "auto", description="full: rank 0 writes the whole model (model.safetensors) and optimizer state (training.pt); "
        "sharded: every process writes its own shards with torch.distributed.checkpoint, none holds the whole "
        "(train/sharded.py); auto: sharded under impl.distributed=fsdp, else full. Either resumes on any number "
        "of processes, in any layout")
    # --- logging
    tensorboard: bool = Field(
        False, description="also write TensorBoard scalars to <run>/events.out.tfevents.* (needs `tensorboard`)"
    )
    wandb: bool = Field(False, description="also log to Weights & Biases (needs `wandb`)")
    wandb_mode: Literal["offline", "online"] = Field(
        "offline", description="W&B mode: offline writes <run>/wandb to sync later (`wandb sync`); online uploads live")
    wandb_project: str = Field("cramlm", description="the W&B project the run is logged under")

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
        if device.index is None:  # torch.cuda.set_device needs an index: bare "cuda" is the current device
            device = torch.device("cuda", torch.cuda.current_device())
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


def launcher_env() -> tuple[int, int, int]:
    """(RANK, LOCAL_RANK, WORLD_SIZE) as torchrun sets them; (0, 0, 1) in a plain process. Read
    without torch, so the pipeline knows which process writes before it imports torch."""
    env = os.environ
    return int(env.get("RANK", "0")), int(env.get("LOCAL_RANK", "0")), int(env.get("WORLD_SIZE", "1"))


def resolve_precision(impl: ImplConfig, device: torch.device, model: torch.nn.Module | None = None):
    """``impl.precision`` -> a :class:`~cramlm.train.hardware.PrecisionChoice` with its reason. ``auto``
    is measured once per machine at the model's widths (train/hardware.py); ``model`` gives them."""
    from cramlm.train.hardware import PrecisionChoice, choose_precision

    if impl.precision != "auto":
        return PrecisionChoice(impl.precision, f"impl.precision={impl.precision}", None, "config")
    cfg = getattr(model, "cfg", None)
    hidden = getattr(cfg, "hidden_size", None) or getattr(model, "hidden_size", None) or 768
    intermediate = getattr(cfg, "intermediate_size", None) or 4 * hidden
    return choose_precision(device, hidden, intermediate)


def autocast_dtype(impl: ImplConfig, device: torch.device, model: torch.nn.Module | None = None) -> torch.dtype | None:
    return resolve_precision(impl, device, model).dtype


def autocast(device: torch.device, dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    import torch

    return torch.autocast(device_type=device.type, dtype=dtype)
