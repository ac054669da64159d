"""Optimizers, built from registered configs, with no weight decay on biases and norms.

AdamW (fused kernel on CPU and GPU), Adam, Lion, Adafactor, SGD, and Muon (torch's, on the hidden
matrices) with AdamW on the rest. Adding one = a config class and a registered builder that takes
the parameter groups. An optimizer whose step costs matmul FLOPs says how many (``flops_per_step``),
so the budget and MFU count them."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from cramlm.config.registry import register
from cramlm.models.model import PositionEmbedding
# the configs live torch-free in train/config.py (validating a config imports no torch)
from cramlm.train.config import AdafactorConfig, AdamConfig, AdamWConfig, LionConfig, MuonConfig, OptimizerConfig, SGDConfig

MUON_TORCH = "2.9"  # the first torch with torch.optim.Muon


def param_groups(model: nn.Module, cfg: OptimizerConfig) -> list[dict]:
    """Decay matrices; never biases, norm weights or scalars (any parameter with ndim < 2).
    Tied parameters (decoder = embedding) appear once. Muon: the hidden matrices (``hidden_matrices``)
    form a first group of their own (``"muon": True``), the rest are AdamW's two groups."""
    # token embeddings and learned position tables (Modalities' "embedding" group holds both)
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    embeddings |= {id(m.table) for m in model.modules() if isinstance(m, PositionEmbedding) and isinstance(m.table, nn.Parameter)}
    hidden = {id(p) for p in hidden_matrices(model)} if isinstance(cfg, MuonConfig) else set()
    muon, decay, no_decay, seen = [], [], [], set()
    for p in model.parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        skip = p.ndim < 2 or (id(p) in embeddings and not cfg.decay_embeddings)
        (muon if id(p) in hidden else no_decay if skip else decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if isinstance(cfg, MuonConfig):
        hidden_group = {"params": muon, "weight_decay": cfg.weight_decay, "muon": True}
        if cfg.split_fused:  # per parameter: its row blocks, or None (one matrix)
            blocks = fused_blocks(model)
            hidden_group["rows"] = [blocks.get(id(p)) for p in muon]
        groups = [hidden_group] + [{**g, "muon": False} for g in groups]
    return groups


def fused_blocks(model: nn.Module) -> dict[int, list[int]]:
    """{id(weight): its row blocks} of the fused linear layers: a module names them in ``fused_rows``
    (attention's qkv: q | k | v; a gated FFN's up: gate | value)."""
    return {id(getattr(m, name).weight): rows for m in model.modules() for name, rows in getattr(m, "fused_rows", {}).items()}


def hidden_matrices(model: nn.Module) -> list[nn.Parameter]:
    """The matrices Muon trains: weights of the nn.Linear layers, except an output layer to the
    vocabulary (``out_features == model.vocab_size``: the LM head, the MLM decoder), an output to one
    value (RTD's detector: a vector, not a matrix) and any weight shared with an embedding (a tied
    head). Everything else (embeddings, norms, biases, position
    tables, scalars) stays on AdamW."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    vocab = getattr(model, "vocab_size", None)
    return [m.weight for m in model.modules() if isinstance(m, nn.Linear) and m.weight.requires_grad
            and id(m.weight) not in embeddings and m.out_features not in (vocab, 1)]


def _fused_supported(groups: list[dict]) -> bool:
    """torch's fused Adam(W) kernels run on CPU and CUDA (on a CPU about 8x faster than the default
    per-tensor loop); sharded (DTensor) parameters keep torch's default implementation."""
    from torch.distributed.tensor import DTensor

    params = [p for g in groups for p in g["params"]]
    return all(p.device.type in ("cpu", "cuda") and p.is_floating_point() and not isinstance(p, DTensor) for p in params)


@register("optimizer", "adamw", AdamWConfig)
def build_adamw(cfg: AdamWConfig, groups: list[dict]) -> torch.optim.Optimizer:
    return _adam(torch.optim.AdamW, cfg, groups)


def _adam(cls, cfg, groups: list[dict]) -> torch.optim.Optimizer:
    fused = _fused_supported(groups) if cfg.fused is None else cfg.fused
    return cls(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, fused=fused or None)


@register("optimizer", "adam", AdamConfig)
def build_adam(cfg: AdamConfig, groups: list[dict]) -> torch.optim.Optimizer:
    return _adam(torch.optim.Adam, cfg, groups)


@register("optimizer", "sgd", SGDConfig)
def build_sgd(cfg: SGDConfig, groups: list[dict]) -> torch.optim.Optimizer:
    return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov)


@register("optimizer", "adafactor", AdafactorConfig)
def build_adafactor(cfg: AdafactorConfig, groups: list[dict]) -> torch.optim.Optimizer:
    return torch.optim.Adafactor(groups, lr=cfg.lr, beta2_decay=cfg.beta2_decay, eps=cfg.eps)


class Lion(torch.optim.Optimizer):
    """Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"): the update is the
    sign of an interpolation of momentum and gradient; decoupled weight decay. Use ~3-10x smaller
    lr than AdamW."""

    def __init__(self, params, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99), weight_decay: float = 0.0):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                m = state["exp_avg"]
                p.mul_(1 - group["lr"] * group["weight_decay"])
                update = (m * beta1 + p.grad * (1 - beta1)).sign_()
                p.add_(update, alpha=-group["lr"])
                m.mul_(beta2).add_(p.grad, alpha=1 - beta2)
        return loss


@register("optimizer", "lion", LionConfig)
def build_lion(cfg: LionConfig, groups: list[dict]) -> torch.optim.Optimizer:
    return Lion(groups, lr=cfg.lr, betas=cfg.betas)


def newton_schulz_flops(shape: tuple[int, ...], ns_steps: int) -> float:
    """Matmul FLOPs of torch's Newton-Schulz orthogonalisation of one (A, B) update, as
    torch/optim/_muon.py runs it: X is the matrix with r = min(A, B) rows, c = max(A, B) columns, and
    each iteration is ``G = X @ X.T`` (2 r^2 c), ``addmm(G, G, G)`` (2 r^3) and ``addmm(X, G', X)``
    (2 r^2 c): ns_steps x (4 r^2 c + 2 r^3); for a square n x n matrix and 5 steps, 30 n^3. The
    norm, scaling and elementwise updates are not matmuls and count zero, as in the model's count."""
    r, c = sorted(shape[:2])
    return float(ns_steps * (4 * r * r * c + 2 * r**3))


def newton_schulz(g: torch.Tensor, coefficients: tuple[float, float, float], steps: int, eps: float,
                  dtype: torch.dtype) -> torch.Tensor:
    """torch's Newton-Schulz orthogonalisation (torch/optim/_muon.py), computed in ``dtype`` (torch's:
    bfloat16, bit for bit). X (r x c, r <= c) -> X / |X|, then per step X <- a X + (b G + c G^2) X
    with G = X X^T."""
    a, b, c = coefficients
    tall = g.size(0) > g.size(1)
    x = g.to(dtype).T if tall else g.to(dtype)
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T  # (r, r)
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def adjusted_lr(lr: float, adjust_lr_fn: str | None, shape: tuple[int, ...]) -> float:
    """Muon's lr for an (A, B) matrix, as torch's Muon scales it: ``match_rms_adamw`` 0.2 sqrt(max(A, B))
    (Moonshot's, the update's RMS near AdamW's), ``original`` (or None) sqrt(max(1, A / B)) (Keller
    Jordan's), anything else 1. Parity with torch: tests/train/test_muon.py."""
    a, b = shape[:2]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return lr * math.sqrt(max(1, a / b))
    return lr * (0.2 * math.sqrt(max(a, b)) if adjust_lr_fn == "match_rms_adamw" else 1.0)


def muon_update(params: list, grads: list, bufs: list, group: dict, dtype: torch.dtype) -> None:
    """torch's Muon update of one group (``_single_tensor_muon``) with the Newton-Schulz iteration in
    ``dtype``: Nesterov momentum, orthogonalise, decoupled weight decay, the lr adjusted to the shape."""
    lr, momentum = float(group["lr"]), group["momentum"]
    for p, g, buf in zip(params, grads, bufs):
        buf.lerp_(g, 1 - momentum)
        update = g.lerp(buf, momentum) if group["nesterov"] else buf
        update = newton_schulz(update, group["ns_coefficients"], group["ns_steps"], group["eps"], dtype)
        p.mul_(1 - lr * group["weight_decay"])
        p.add_(update, alpha=-adjusted_lr(lr, group["adjust_lr_fn"], p.shape))


def _block_muon(muon: type) -> type:
    """torch's Muon, orthogonalising each row block of a fused weight separately (``split_fused``):
    the group's ``rows`` names each parameter's blocks, and the parameter, its gradient and its
    momentum buffer go to torch's update as row views, one matrix per block. torch updates them in
    place, so the weight and its state stay one tensor each (checkpoints unchanged). ``ns_dtype``
    other than bfloat16: the same update with the Newton-Schulz iteration in that dtype
    (``muon_update``; torch's computes it in bfloat16)."""

    class BlockMuon(muon):
        ns_dtype = torch.bfloat16

        @torch.no_grad()
        def step(self, closure=None):
            if self.ns_dtype == torch.bfloat16:
                return super().step(closure)
            loss = None if closure is None else closure()
            for group in self.param_groups:
                params, grads, bufs = [], [], []
                self._init_group(group, params, grads, bufs)
                muon_update(params, grads, bufs, group, self.ns_dtype)
            return loss

        def _init_group(self, group, params_with_grad, grads, muon_momentum_bufs):
            has_complex = super()._init_group(group, params_with_grad, grads, muon_momentum_bufs)
            rows = group.get("rows")
            if not rows:
                return has_complex
            blocks = dict(zip(map(id, group["params"]), rows))
            params, grads_, bufs = list(params_with_grad), list(grads), list(muon_momentum_bufs)
            params_with_grad.clear(), grads.clear(), muon_momentum_bufs.clear()
            for p, g, b in zip(params, grads_, bufs):
                split = blocks.get(id(p))
                if split is None:
                    params_with_grad.append(p), grads.append(g), muon_momentum_bufs.append(b)
                    continue
                params_with_grad.extend(p.split(split)), grads.extend(g.split(split)), muon_momentum_bufs.extend(b.split(split))
            return has_complex

    return BlockMuon


class MuonAdamW(torch.optim.Optimizer):
    """torch.optim.Muon on the groups marked ``"muon": True``, torch.optim.AdamW on the others: one
    optimizer to the trainer (one list of param_groups, one state, one state dict keyed like any
    other optimizer's), two torch optimizers inside sharing those groups and that state. Each group
    keeps its peak lr in ``peak_lr``, which the lr schedule scales."""

    def __init__(self, groups: list[dict], cfg: MuonConfig):
        muon = getattr(torch.optim, "Muon", None)
        if muon is None:
            raise ValueError(f"train.optim.type=muon needs torch >= {MUON_TORCH} (torch.optim.Muon); this is "
                             f"torch {torch.__version__}: upgrade torch or choose another train.optim.type")
        adamw_lr = cfg.adamw_lr or cfg.lr
        if cfg.split_fused:
            from torch.distributed.tensor import DTensor

            if any(isinstance(p, DTensor) for g in groups if g.get("rows") for p in g["params"]):
                raise ValueError("train.optim.split_fused=true splits whole weights, and these are sharded "
                                 "(impl.distributed=fsdp): set train.optim.split_fused=false or use impl.distributed=ddp")
        muon_groups = [{**g, "peak_lr": cfg.lr} for g in groups if g["muon"] and g["params"]]
        adamw_groups = [{**g, "peak_lr": adamw_lr} for g in groups if not g["muon"] and g["params"]]
        self.muon = _block_muon(muon)(muon_groups or [{"params": []}], lr=cfg.lr, weight_decay=cfg.weight_decay, momentum=cfg.momentum,
                         nesterov=cfg.nesterov, ns_steps=cfg.ns_steps, adjust_lr_fn=cfg.adjust_lr_fn)
        if cfg.ns_dtype == "auto":
            raise ValueError("train.optim.ns_dtype=auto is resolved by the run's precision (resolve_optimizer) before "
                             "the optimizer is built")
        self.muon.ns_dtype = getattr(torch, cfg.ns_dtype)
        self.adamw = torch.optim.AdamW(adamw_groups or [{"params": []}], lr=adamw_lr, betas=cfg.betas, eps=cfg.eps,
                                       weight_decay=cfg.weight_decay)
        super().__init__(self.muon.param_groups + self.adamw.param_groups, {})
        self._link()

    def _link(self) -> None:
        """Point the inner optimizers at this one's groups and state (again after load_state_dict,
        which replaces both)."""
        n = len(self.muon.param_groups)
        self.muon.param_groups, self.adamw.param_groups = self.param_groups[:n], self.param_groups[n:]
        self.muon.state = self.adamw.state = self.state

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self._link()

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()
        self.muon.step()
        self.adamw.step()
        return loss

    def flops_per_step(self) -> float:
        """Newton-Schulz matmul FLOPs of one step over all Muon matrices (global shapes: a sharded
        parameter counts once, whatever the number of processes)."""
        return sum(newton_schulz_flops((r, p.shape[1]), g["ns_steps"]) for g in self.muon.param_groups
                   for p, rows in zip(g["params"], g.get("rows") or [None] * len(g["params"])) for r in (rows or [p.shape[0]]))


@register("optimizer", "muon", MuonConfig)
def build_muon(cfg: MuonConfig, groups: list[dict]) -> torch.optim.Optimizer:
    return MuonAdamW(groups, cfg)


def resolve_optimizer(cfg: OptimizerConfig, precision: str) -> OptimizerConfig:
    """``train.optim`` with what follows the run's resolved precision ("fp32", "bf16", "fp16") made
    concrete: Muon's ``ns_dtype=auto`` -> float32 in an fp32 run, else bfloat16."""
    if getattr(cfg, "ns_dtype", None) != "auto":
        return cfg
    return cfg.model_copy(update={"ns_dtype": "float32" if precision == "fp32" else "bfloat16"})


def optimizer_flops_per_step(optimizer: torch.optim.Optimizer) -> float:
    """Matmul FLOPs of one optimizer step (0 for the elementwise optimizers: AdamW, Lion, ...)."""
    count = getattr(optimizer, "flops_per_step", None)
    return float(count()) if count else 0.0


@contextmanager
def config_hyperparameters(optimizer: torch.optim.Optimizer) -> Iterator[None]:
    """Load a state dict keeping every hyperparameter this optimizer's groups were built with from the
    run's config (lr, betas, weight decay, Muon's momentum, peak lrs, Newton-Schulz settings, ...):
    a checkpoint brings the state (moments, step counts), a resume's config the settings. Without a
    change they are the same values; with an allowed one (``--allow-change train.optim.lr``) the new
    value takes effect (torch's load_state_dict restores the writer's groups). The kernel choice
    (foreach, fused, ...) stays this process's too: an FSDP2 run's Adam is unfused (sharded
    parameters), a one-process run's fused, and torch's Adam takes the device-side skip flag
    (``OptimizerStep.step(skip=...)``) only fused."""
    built = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    yield
    if len(built) != len(optimizer.param_groups):
        raise RuntimeError(f"the checkpoint's optimizer has {len(optimizer.param_groups)} parameter groups, this run's {len(built)}")
    for group, settings in zip(optimizer.param_groups, built):
        group.update(settings)


def build_optimizer(cfg: OptimizerConfig, model: nn.Module) -> torch.optim.Optimizer:
    from cramlm.config.registry import build

    return build("optimizer", cfg, param_groups(model, cfg))
