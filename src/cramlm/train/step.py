"""One optimizer step with mixed precision, shared by pretraining (trainer.py) and fine-tuning
(eval/finetune.py): autocast for the forward passes, a GradScaler for fp16 (a no-op otherwise),
unscaling and gradient clipping, the step, and the gradients cleared.

Nothing here reads a value back to the host: the gradient norm stays a device tensor, and a step
can be dropped on the device (``step(skip=flag)``) by optimizers that support it (torch's fused
Adam/AdamW take a ``found_inf`` tensor, as GradScaler passes them), so a training loop needs no
synchronisation per step to drop non-finite updates.
"""

from __future__ import annotations

import torch
from torch import nn

from cramlm.train.impl import autocast


class OptimizerStep:
    def __init__(self, optimizer: torch.optim.Optimizer, module: nn.Module, device: torch.device,
                 amp: torch.dtype | None, grad_clip: float | None):
        self.optimizer, self.module, self.device, self.amp = optimizer, module, device, amp
        self.grad_clip = grad_clip if grad_clip and grad_clip > 0 else None
        self.scaler = torch.amp.GradScaler(device.type, enabled=amp is torch.float16)

    @property
    def skips_on_device(self) -> bool:
        """Whether ``step(skip=...)`` drops a step without a host read: a fused optimizer and no
        GradScaler (which hands the optimizer its own flag)."""
        return bool(getattr(self.optimizer, "_step_supports_amp_scaling", False)) and not self.scaler.is_enabled()

    def autocast(self):
        return autocast(self.device, self.amp)

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def clip(self) -> torch.Tensor | None:
        """Unscale (fp16) and clip the gradients: their total norm before clipping (a device
        tensor, the same on every process), or None when clipping is off."""
        if self.grad_clip is None:
            return None
        self.scaler.unscale_(self.optimizer)
        norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.grad_clip)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP2: a DTensor

    def step(self, skip: torch.Tensor | None = None) -> None:
        """Apply the update (``skip``: a device flag; where true the update is dropped on the
        device, see ``skips_on_device``), then clear the gradients."""
        if skip is not None:
            self.optimizer.found_inf = skip.to(torch.float32)
        try:
            self.scaler.step(self.optimizer)
        finally:
            if skip is not None:
                del self.optimizer.found_inf
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)

    def drop(self) -> None:
        """Drop this step's gradients without an update (fp16: the loss scale backs off, as after
        an overflow)."""
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler.is_enabled():
            self.scaler.update(self.scaler.get_scale() * self.scaler.get_backoff_factor())

    def __call__(self) -> torch.Tensor | None:
        """Clip, step and clear: a whole step after ``backward``. The gradient norm (or None)."""
        norm = self.clip()
        self.step()
        return norm

    def state_dict(self) -> dict:
        return self.scaler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        if state:
            self.scaler.load_state_dict(state)
