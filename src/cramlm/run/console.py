"""What ``cramlm pretrain`` tells a person: the banner's names for the architecture and the
objective, and the short summary at the end (summary.json holds everything)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cramlm.run.config import PretrainConfig


def _si(x: float) -> str:
    """12,345 -> '12.3k', 4.2e9 -> '4.2G' (console figures)."""
    for size, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= size:
            return f"{x / size:.3g}{suffix}"
    return f"{x:.3g}"


def _objective_label(summary: dict, which: str) -> str:
    """The objective's name (config: ``train_loss`` / ``val_loss``) of a loss in summary.json, its
    ``{key}``s filled from the summary, else from the objective's defaults."""
    from cramlm.config.registry import RegistryError, config_class

    try:
        config = config_class("objective", summary.get("objective") or "mlm")
    except RegistryError:  # a plugin's objective whose plugin is not loaded
        config = config_class("objective", "mlm")
    return getattr(config, which).format(**{**config().model_dump(), **summary})


def train_loss_label(summary: dict) -> str:
    """What the train loss is (an ELECTRA run's adds the weighted detector loss to the generator's)."""
    return _objective_label(summary, "train_loss")


def val_loss_label(summary: dict) -> str:
    return _objective_label(summary, "val_loss")


def console_summary(summary: dict, run_dir: Path) -> str:
    """What the console shows at the end of pretraining (summary.json holds everything)."""
    def loss(x):
        return "-" if x is None else f"{x:.3f}"

    speed = summary.get("tokens_per_second")
    mfu = summary.get("mfu")
    lines = [
        f"cramlm pretrain: done: {summary['steps']:,} steps, {_si(summary['tokens'])} tokens in "
        f"{summary['train_seconds']:.1f} s (+{summary['setup_seconds']:.1f} s setup)"
        + (f", {speed:,.0f} tokens/s" if speed else "") + (f", MFU {100 * mfu:.1f}%" if mfu is not None else ""),
        f"  loss {loss(summary.get('first_loss'))} -> {loss(summary.get('last_loss'))} ({train_loss_label(summary)}), "
        f"validation {loss(summary.get('val_loss'))} ({val_loss_label(summary)}part of the held-out set; "
        "`cramlm eval` scores it all)",
        f"  run folder {run_dir}: model.safetensors, summary.json, metrics.jsonl; "
        f"checkpoint {Path(summary['final_checkpoint']).name}",
    ]
    return "\n".join(lines)


def arch_banner(arch) -> str:
    """The architecture as the banner names it: 'crammed-bert', 'bert-original (type crammed-bert)'."""
    from cramlm.models.hf import architecture_name

    name = architecture_name(arch)
    return name if name == arch.type else f"{name} (type {arch.type})"


def objective_banner(cfg: PretrainConfig) -> str:
    """The objective as the banner names it: 'rtd (ELECTRA: generator MLM + replaced-token detection)'."""
    from cramlm.config.registry import config_class
    from cramlm.models.objectives.base import run_objective_name

    name = run_objective_name(cfg)
    return f"{name} ({config_class('objective', name).title})"
