"""Implementation settings (the ``impl`` group): device, precision, microbatch, threads."""

from __future__ import annotations

import contextlib
from typing import Literal

import torch

from cramlm.config.base import Config


class ImplConfig(Config):
    device: str = "auto"  # auto: cuda if available, else cpu
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"  # auto: bf16 on GPU, fp32 on CPU
    microbatch_size: int = 128  # sequences per forward/backward; train.batch_size is reached by accumulation
    threads: int | None = None  # torch CPU threads (None: torch's default)
    tf32: bool = True
    data_cache: str = "outputs/data"  # where prepared data is cached, keyed by the data config
    progress: bool = True  # progress bars
    dryrun_steps: int = 4  # optimizer steps taken when dryrun=true


def setup_device(impl: ImplConfig) -> torch.device:
    if impl.threads:
        torch.set_num_threads(impl.threads)
    name = impl.device
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = impl.tf32
        torch.backends.cudnn.allow_tf32 = impl.tf32
    return device


def autocast_dtype(impl: ImplConfig, device: torch.device) -> torch.dtype | None:
    precision = impl.precision
    if precision == "auto":
        precision = "bf16" if device.type == "cuda" else "fp32"
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def autocast(device: torch.device, dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)
