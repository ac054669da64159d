"""The :class:`Objective` interface: what differs between pretraining objectives, owned in one
module per objective (mlm.py, clm.py, rtd.py, hybrid.py; a plugin's own module the same way).

An objective is built for a run (:func:`build_objective`) from its config (config.py; its options
are ``train.<name>``) and the train group, and says:

- the batch it trains on (``collator``: data/collate.py's keyed masker, or its own);
- the training model around the arch (``training_model``; the arch itself for mlm and clm) whose
  forward gives ``loss`` and the logged parts (keys ending in ``_loss``) and, when it has one,
  ``flops_per_token`` (train/flops.py counts the model's own);
- the run's weights: the arch's part (``encoder_state``: model.safetensors, what fine-tuning and
  export load) and the parts the arch lacks (``parts_state``: ``trained_parts`` beside it);
- the held-out loss: the model ``eval_model`` gives scores the held-out set of its arch kind
  (data/heldout.py), labelled with the objective's name (config: ``heldout_scored_by``);
- zero-shot scoring (``scorers``: which scoring function of eval/sentence_scores.py, and a
  callable into the trained model);
- the export (``export``, ``load_lines``) and its first transformers Auto class.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from cramlm.config.registry import builder, config_class
from cramlm.models.objectives.config import ObjectiveConfig

if TYPE_CHECKING:
    import torch
    from torch import nn


@dataclass
class Scorer:
    """One zero-shot scorer of sentences: ``kind`` names eval/sentence_scores.py's function,
    ``fn`` calls into the trained model:
    mlm: Predict (ids (B, T), mask (B, T), where (B,)) -> (B, V) logits of the token at ``where``;
    clm: Logits (ids, mask) -> (B, T, V) logits at t of the token at t + 1;
    rtd: Logits (ids, mask) -> (B, T) replaced-token detector logits."""

    name: str  # "pll", "log-probability", "detector" name the methods alone; any other prefixes them
    kind: str
    fn: Callable
    full_logits: bool = False  # fn computes (B, T, V) logits: the scorer caps its batch by the vocabulary


def tokenizer_line(out_dir: Path | str) -> str:
    """A remote-code export's tokenizer loads with trust_remote_code too (its config names the remote
    classes; without it AutoTokenizer stops at an interactive prompt)."""
    return f"tokenizer: transformers.AutoTokenizer.from_pretrained('{out_dir}', trust_remote_code=True)"


def objective_name(arch_kind: str, train_objective: str) -> str:
    """The objective a run trains: ``train.objective``, except that a causal arch's default (mlm) is clm."""
    return "clm" if arch_kind == "clm" and train_objective == "mlm" else train_objective


def run_objective_name(cfg: Any) -> str:
    """The objective of a run config (``PretrainConfig``): mlm, clm, rtd, hybrid or a plugin's."""
    return objective_name(type(cfg.arch).objective, cfg.train.objective)


def objective_options(name: str, train: Any) -> ObjectiveConfig:
    """The options of objective ``name``: its block ``train.<name>`` (the built-in ones), else a plugin's
    ``train.objective_options`` read by its config class (its defaults where unset)."""
    options = getattr(train, name, None)
    if isinstance(options, ObjectiveConfig):
        return options
    return config_class("objective", name).model_validate(getattr(train, "objective_options", None) or {})


def build_objective(cfg: Any) -> Objective:
    """The objective of a run config (``PretrainConfig``), built by its registered class."""
    name = run_objective_name(cfg)
    return builder("objective", name)(objective_options(name, cfg.train), cfg.train)


def num_special() -> int:
    """Ids below this are cramlm's special tokens ([PAD] [UNK] [CLS] [SEP] [MASK])."""
    from cramlm.data.tokenizer import SPECIAL_TOKENS

    return len(SPECIAL_TOKENS)


def masked_collator(train: Any, vocab_size: int, seed: int, sample_noise: bool = False):
    """BERT's keyed masker at ``train.mlm_probability`` (data/collate.py)."""
    from cramlm.data.collate import MLMCollator
    from cramlm.data.tokenizer import MASK_ID

    return MLMCollator(vocab_size, MASK_ID, num_special(), train.mlm_probability, seed, sample_noise=sample_noise)


def at_positions(encode: Callable, head: Callable) -> Callable:
    """A Predict from an encoder and an LM head: the head only at the one position per row asked for."""

    def predict(ids: torch.Tensor, mask: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
        import torch

        hidden = encode(ids, mask)  # (B, T, H)
        return head(hidden[torch.arange(len(ids), device=ids.device), where])  # (B, V)

    return predict


class Objective:
    """The default behaviour: the arch trains itself (its forward is the loss) and is the whole
    trained model; subclasses give the batch and what differs."""

    name: ClassVar[str] = ""
    auto_class: ClassVar[str] = "AutoModelForMaskedLM"  # the transformers class an export loads with first
    trained_parts: ClassVar[str | None] = None  # the file beside model.safetensors holding what the arch lacks

    def __init__(self, options: ObjectiveConfig, train: Any):
        self.options, self.train = options, train

    @property
    def config(self) -> type[ObjectiveConfig]:
        return type(self.options)

    # ---- training
    def collator(self, vocab_size: int, seed: int) -> Callable:
        """The batches it trains on: ``collate(blocks, positions)`` (data/collate.py's contract)."""
        raise NotImplementedError

    def training_model(self, arch: nn.Module) -> nn.Module:
        """The model trained around ``arch`` (the run's model; its forward returns the loss)."""
        return arch

    def summary(self) -> dict:
        """What summary.json records of the objective besides its name."""
        return {}

    # ---- the run's weights
    def encoder_state(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The arch's weights, under its own names, from a training model's state dict."""
        return state

    def parts_state(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The weights the arch lacks (``trained_parts``), from a training model's state dict."""
        return {}

    def load_parts(self, model: nn.Module, parts: dict[str, torch.Tensor], where: str) -> None:
        """Load ``parts`` (:meth:`parts_state`) into ``model``, whose arch holds its weights already."""

    def eval_model(self, arch: nn.Module) -> nn.Module:
        """The model that `cramlm eval` scores the held-out set and minimal pairs with, around ``arch``
        (which fine-tuning goes on using: it must not change it)."""
        return self.training_model(arch)

    # ---- zero-shot
    def scorers(self, model: nn.Module) -> list[Scorer]:
        """The zero-shot scorers of ``model`` (:meth:`eval_model`'s), the headline first."""
        raise NotImplementedError

    # ---- export
    def export(self, model: nn.Module, tok, out_dir: Path, eos: str | None) -> str:
        """Write ``model`` (:meth:`eval_model`'s, trained) as a transformers folder; its class."""
        from cramlm.models.hf import export_hf

        return export_hf(model, tok, out_dir, eos=eos)

    def load_lines(self, out_dir: Path, cls: str) -> list[str]:
        """How to load the export, as `cramlm export hf` prints it and the model card says."""
        remote = ", trust_remote_code=True" if cls.startswith("Cramlm") else ""
        return [f"load with: transformers.{self.auto_class}.from_pretrained('{out_dir}'{remote})",
                *([tokenizer_line(out_dir)] if remote else [])]
