"""Make a plain model ready to train on this device and these processes (torchtitan's
``parallelize``): the model code stays free of distributed and performance code, all of it is
applied here, from outside, in this order (after the attention kernel for packed documents,
``impl.document_attention_kernel``, is set on the model):

1. activation checkpointing (``impl.activation_checkpointing``): each block (every child of an
   ``nn.ModuleList``) is wrapped to recompute its activations in backward. First, so that FSDP2
   shards the wrapped blocks and the recomputation happens inside each block's all-gather;
2. data parallelism (``impl.distributed``): DDP wraps the model, or FSDP2 shards each block and
   then the root in place (distributed.wrap_model);
3. compilation (``impl.compile``): ``torch.compile`` of the result, last, so that it traces what
   actually runs (with DDP, dynamo's DDPOptimizer splits the graph at the gradient buckets).
   torchtitan compiles each block before FSDP instead; the whole-model compile is kept here
   because it also serves DDP and single-process runs with one call.

The optimizer is built afterwards from ``Parallel.module`` (under FSDP2 its parameters are the
sharded DTensors), in the Trainer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from cramlm.models.base import tied_aliases
from cramlm.train.distributed import Dist, wrap_model
from cramlm.train.impl import ImplConfig


@dataclass
class Parallel:
    """A model ready to train: ``module`` holds the parameters (state dicts, the optimizer),
    ``model`` is what a step calls (``module``, or DDP around it, compiled or not)."""

    module: nn.Module
    model: nn.Module
    dist: Dist
    device: torch.device
    aliases: dict[str, str]  # tied parameter names (checkpoints store each tied tensor once)


def parallelize(model: nn.Module, impl: ImplConfig, dist: Dist, device: torch.device) -> Parallel:
    """Activation checkpointing, then DDP/FSDP2, then torch.compile (see the module docstring).
    ``model`` must already be on ``device``, except under FSDP2: on the host, each block moves to
    ``device`` as it is sharded, so the unsharded model never has to fit one device."""
    aliases = tied_aliases(model)  # before wrapping renames anything
    set_document_kernel(model, impl.document_attention_kernel)
    if impl.activation_checkpointing:
        apply_activation_checkpointing(model)
    wrapped = wrap_model(model, dist, device)  # DDP wrapper, or the same module sharded by FSDP2
    if impl.compile:
        wrapped = compile_model(wrapped, impl)
    return Parallel(module=model, model=wrapped, dist=dist, device=device, aliases=aliases)


def set_document_kernel(model: nn.Module, kernel: str) -> None:
    """How every trunk of ``model`` attends within packed documents: auto, flex or dense (model.Trunk)."""
    for module in model.modules():
        if hasattr(module, "document_kernel"):
            module.document_kernel = kernel


def apply_activation_checkpointing(model: torch.nn.Module) -> int:
    """Wrap every child of every nn.ModuleList (the transformer blocks, whatever the model) so its
    activations are recomputed in backward. Applied from outside: the model code stays plain."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing as apply

    blocks = {id(b) for m in model.modules() if isinstance(m, torch.nn.ModuleList) for b in m}
    apply(model, check_fn=lambda m: id(m) in blocks)
    return len(blocks)


def compile_model(model: torch.nn.Module, impl: ImplConfig) -> torch.nn.Module:
    """torch.compile (inductor). ``compile=auto`` compiles where it pays and is proven: a model on a
    CUDA device that no DDP/FSDP wrapper holds. On a CPU the model is returned as it is: cpu-1h
    compiled ran at 0.95x eager's steps a minute (one Zen 2 core, fp32, steps 40-120) after ~3
    minutes of C++ code generation (benchmarks/results/bridge/README.md)."""
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
