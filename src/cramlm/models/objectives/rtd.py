"""ELECTRA's replaced-token detection (Clark et al. 2020) around a masked LM: ``train.objective=rtd``.

The discriminator is the run's arch itself (a ``CrammedBert``, unchanged): it is what fine-tuning
and export use (the run's model.safetensors holds it alone). The generator is a narrow MLM
(``RTDConfig.generator_size`` of the width, same depth) sharing the discriminator's token
embedding; it and the detector head are the run's trained parts (``electra.safetensors`` beside
model.safetensors; in checkpoints, for resume).

One training forward, on a batch masked as for MLM (data/collate.py) plus ``sample_noise``:
  generator(masked input) -> MLM loss and logits at the M masked positions
  replacement = inverse-CDF sample of softmax(logits) with the batch's noise (no gradient)
  discriminator(original tokens, replacements at the masked positions) -> per position: replaced?
  loss = generator MLM loss + rtd_weight x binary cross-entropy over the non-special positions
A sample equal to the original token counts as original (ELECTRA). The noise is keyed by stream
position like the masks (one uniform per token), so the replacements depend only on the weights
and the data: resume stays bitwise and N processes train on what one does.

Without ``sample_noise`` (held-out scoring: val_loss, `cramlm eval`) the loss is the generator's
MLM loss on the given masks, which is what an RTD run's held-out loss reports (as objective rtd).
Zero-shot, the discriminator's detector scores a sentence (the log-probability that each token is
original), the generator's pseudo-log-likelihood beside it. The export holds what was trained: the
discriminator with its detector (``CramlmForPreTraining``) and, in ``generator/``, the generator as
a masked LM (models/hf_modeling.py's classes).
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from cramlm.config.registry import register
from cramlm.models.base import tied_aliases
from cramlm.models.config import TransformerConfig, trunk_flops_per_token
from cramlm.models.crammed_bert import CrammedBert
from cramlm.models.model import ACTIVATIONS, IGNORE_INDEX, Trunk, init_weights, make_norm
from cramlm.models.objectives.base import Objective, Scorer, at_positions, masked_collator, num_special, tokenizer_line
from cramlm.models.objectives.config import RTDConfig


def generator_config(cfg: TransformerConfig, size: float) -> TransformerConfig:
    """The discriminator's config at ``size`` of its width: heads keep their dimension (at least one),
    the FFN width scales alike (even for a GLU); depth and every other choice stay."""
    D = cfg.hidden_size // cfg.num_heads
    heads = max(1, round(cfg.num_heads * size))
    inner = max(2, 2 * round(cfg.intermediate_size * size / 2))
    return cfg.model_copy(update={"hidden_size": heads * D, "num_heads": heads, "num_kv_heads": None,
                                  "intermediate_size": inner, "pooler_size": None})


class Generator(nn.Module):
    """A narrow MLM on the shared (V, H) token embedding: embedding -> (H -> h) -> trunk of width h ->
    (h -> H) dense + activation + norm -> logits against the shared embedding (ELECTRA's generator
    when its hidden size is below the embedding size)."""

    def __init__(self, cfg: TransformerConfig, tokens: nn.Embedding, vocab_size: int):
        super().__init__()
        H, h = tokens.embedding_dim, cfg.hidden_size
        self.tokens = tokens  # the discriminator's (shared; trained by both losses)
        self.trunk = Trunk(cfg, vocab_size, causal=False)
        self.dense = nn.Linear(h, H, bias=cfg.bias)
        self.act = ACTIVATIONS[cfg.activation]
        self.norm = make_norm(cfg.norm, H, cfg.norm_eps, cfg.norm_bias)
        init_weights(self.trunk, cfg.init_std, cfg.init, cfg.num_layers, cfg.zero_init_out)
        init_weights(self.dense, cfg.init_std)
        self.trunk.tokens = nn.Sequential(tokens, nn.Linear(H, h, bias=False))  # (B, T) -> (B, T, H) -> (B, T, h)
        init_weights(self.trunk.tokens[1], cfg.init_std)

    def forward(self, input_ids, scored, targets, *context) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean MLM loss, (M, V) logits) at the ``scored`` (B, T) positions, whose ``targets`` are (M,)."""
        logits = self.head(self.trunk(input_ids, *context)[scored])  # (M, V)
        return F.cross_entropy(logits.float(), targets), logits

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., h) trunk states -> (..., V) logits against the shared embedding."""
        return self.norm(self.act(self.dense(hidden))) @ self.tokens.weight.T  # (..., H) @ (H, V)


def sample_tokens(logits: torch.Tensor, noise: torch.Tensor, num_special: int) -> torch.Tensor:
    """(M, V) logits, (M,) uniforms in [0, 1) -> (M,) ids drawn from softmax(logits) over the
    non-special ids by inverse CDF: deterministic given the noise (one uniform per position)."""
    probs = torch.softmax(logits.float(), dim=-1)
    probs[:, :num_special] = 0.0
    cdf = probs.cumsum(dim=-1)  # (M, V)
    point = (noise.to(cdf.dtype) * cdf[:, -1]).unsqueeze(-1)  # (M, 1), below the total mass
    ids = torch.searchsorted(cdf, point, right=True).squeeze(-1)  # the first id whose cdf exceeds it
    return ids.clamp(num_special, logits.shape[-1] - 1)


class ReplacedTokenDetection(nn.Module):
    """Discriminator (the arch's CrammedBert) + generator + detector head (dense, GELU, dense -> 1:
    ELECTRA's discriminator head). ``encode`` is the discriminator's."""

    def __init__(self, discriminator: CrammedBert, rtd: RTDConfig, num_special: int):
        super().__init__()
        self.discriminator = discriminator
        self.cfg, self.rtd = discriminator.cfg, rtd
        shared = discriminator.tokens.weight
        for p in discriminator.head.parameters():  # its MLM head is unused here: frozen (DDP wants no unused ones)
            p.requires_grad_(p is shared)
        self.hidden_size, self.vocab_size, self.num_special = discriminator.hidden_size, discriminator.vocab_size, num_special
        self.generator_cfg = generator_config(self.cfg, rtd.generator_size)
        self.generator = Generator(self.generator_cfg, discriminator.tokens, self.vocab_size)
        H = self.hidden_size
        self.detector = nn.Sequential(nn.Linear(H, H), nn.GELU(), nn.Linear(H, 1))
        init_weights(self.detector, self.cfg.init_std)

    def encode(self, *args, **kwargs) -> torch.Tensor:
        return self.discriminator.encode(*args, **kwargs)

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T) masked as for MLM (data/collate.py)
        attention_mask: torch.Tensor | None = None,  # (B, T) 1 = token, 0 = padding
        labels: torch.Tensor | None = None,  # (B, T) the original token where masked, -100 elsewhere
        position_ids: torch.Tensor | None = None,
        document_ids: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        sample_noise: torch.Tensor | None = None,  # (B, T) uniforms in [0, 1): training (see the module docstring)
    ) -> dict[str, torch.Tensor | None]:
        """{"loss", "logits"}: without labels, logits (B, T) = the detector's replaced-token logits of
        ``input_ids``; with labels, no noise: the generator's MLM loss; with both: the RTD loss, and
        its parts as "mlm_loss" and "rtd_loss" (detached)."""
        context = (attention_mask, position_ids, document_ids, token_type_ids)
        if labels is None:
            return {"loss": None, "logits": self.detector(self.encode(input_ids, *context)).squeeze(-1)}
        scored = labels != IGNORE_INDEX  # (B, T) the masked positions
        mlm_loss, logits = self.generator(input_ids, scored, labels[scored], *context)  # (), (M, V)
        if sample_noise is None:
            return {"loss": mlm_loss, "logits": None}
        with torch.no_grad():
            original = torch.where(scored, labels, input_ids)  # (B, T)
            corrupted = original.clone()
            corrupted[scored] = sample_tokens(logits.detach(), sample_noise[scored], self.num_special)
            replaced = (corrupted != original).float()  # (B, T); a sample equal to the original is original
            counted = original >= self.num_special  # every non-special position
            if attention_mask is not None:
                counted &= attention_mask.bool()
        z = self.detector(self.encode(corrupted, *context)).squeeze(-1)  # (B, T)
        rtd_loss = F.binary_cross_entropy_with_logits(z[counted].float(), replaced[counted])
        loss = mlm_loss + self.rtd.rtd_weight * rtd_loss
        return {"loss": loss, "logits": None, "mlm_loss": mlm_loss.detach(), "rtd_loss": rtd_loss.detach()}

    def forward_flops_per_token(self, seq_len: int, predicted_fraction: float = 1.0) -> float:
        """Forward FLOPs per token of both networks: the generator (input projection and trunk at
        every position, head at the masked ones) and the discriminator (trunk and detector at every
        position). Softmax and sampling are not matmuls and count zero."""
        H, h, V = self.hidden_size, self.generator_cfg.hidden_size, self.vocab_size
        generator = 2 * H * h + trunk_flops_per_token(self.generator_cfg, seq_len) + predicted_fraction * (2 * h * H + 2 * H * V)
        discriminator = trunk_flops_per_token(self.cfg, seq_len) + 2 * H * H + 2 * H
        return generator + discriminator

    def flops_per_token(self, seq_len: int, predicted_fraction: float = 1.0) -> float:
        """Training FLOPs per token: 3 x the forward (see TransformerLM.flops_per_token)."""
        return 3 * self.forward_flops_per_token(seq_len, predicted_fraction)


def build_rtd(discriminator: nn.Module, rtd: RTDConfig, num_special: int) -> ReplacedTokenDetection:
    """``discriminator`` (the arch's model, which must be a crammed-bert encoder) inside ELECTRA's training model."""
    if not isinstance(discriminator, CrammedBert):
        raise ValueError(f"train.objective=rtd: arch.type={discriminator.cfg.type} is not a crammed-bert encoder")
    return ReplacedTokenDetection(discriminator, rtd, num_special)


def discriminator_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The discriminator's part of a ReplacedTokenDetection state dict, under the arch's own names
    (what a run's model.safetensors holds: a CrammedBert's weights)."""
    prefix = "discriminator."
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


TRAINED_PARTS = "electra.safetensors"  # beside an RTD run's model.safetensors: its generator and detector


def training_parts(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The generator's and the detector's part of a ReplacedTokenDetection state dict, under their
    full names (what an RTD run's electra.safetensors holds; the shared token embedding is the
    discriminator's, in model.safetensors)."""
    return {k: v for k, v in state.items() if k.startswith(("generator.", "detector."))}


def load_training_parts(model: ReplacedTokenDetection, parts: dict[str, torch.Tensor], where: str) -> None:
    """Load ``parts`` (:func:`training_parts`) into ``model``, whose discriminator holds its weights
    already; every generator and detector weight must be there (shared ones come with the discriminator)."""
    missing, unexpected = model.load_state_dict(parts, strict=False)
    aliases = tied_aliases(model)
    missing = [k for k in missing if not k.startswith("discriminator.") and k not in aliases]
    if missing or unexpected:
        raise ValueError(f"{where}: does not fit this run's generator and detector (missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]})")


def export_rtd(model: ReplacedTokenDetection, tok, out_dir: Path) -> str:
    """The training model as what it trained: ``out_dir`` holds the discriminator with its detector
    (CramlmForPreTraining; no masked-LM class: its MLM head was never trained, so fill-mask is
    refused) and ``out_dir/generator`` the generator as a masked LM (CramlmGeneratorForMaskedLM)."""
    from cramlm.models.hf import write_tokenizer
    from cramlm.models.hf_remote import write_remote

    disc = model.discriminator
    special = write_tokenizer(tok, out_dir, disc.cfg.max_seq_length)
    (out_dir / "generator").mkdir(exist_ok=True)
    write_tokenizer(tok, out_dir / "generator", disc.cfg.max_seq_length)
    state = {k: v for k, v in model.state_dict().items() if k.startswith(("discriminator.trunk.", "detector."))}
    state = {k.removeprefix("discriminator."): v for k, v in state.items()}
    aliases = {k.removeprefix("discriminator."): c.removeprefix("discriminator.") for k, c in tied_aliases(model).items()}
    classes = {"AutoModelForPreTraining": "CramlmForPreTraining",
               "AutoModelForSequenceClassification": "CramlmForSequenceClassification",
               "AutoModelForTokenClassification": "CramlmForTokenClassification"}
    write_remote(out_dir, classes, disc.cfg, "rtd", disc.vocab_size, special, state, aliases, tie_word_embeddings=False,
                 generator="generator")
    gen = model.generator
    gen_state = {k: v for k, v in gen.state_dict().items() if k != "tokens.weight"}  # it is trunk.tokens.0.weight
    write_remote(out_dir / "generator", {"AutoModelForMaskedLM": "CramlmGeneratorForMaskedLM"}, model.generator_cfg, "mlm",
                 disc.vocab_size, special, gen_state, {}, tie_word_embeddings=False, embedding_size=disc.hidden_size,
                 classifier_pooling="first")
    return "CramlmForPreTraining"


@register("objective", "rtd", RTDConfig)
class ELECTRA(Objective):
    """``train.objective=rtd``: see the module docstring."""

    name = "rtd"
    auto_class = "AutoModelForPreTraining"
    trained_parts = TRAINED_PARTS

    def collator(self, vocab_size: int, seed: int):
        return masked_collator(self.train, vocab_size, seed, sample_noise=True)  # the generator samples with the noise

    def training_model(self, arch: nn.Module) -> ReplacedTokenDetection:
        return build_rtd(arch, self.options, num_special())

    def summary(self) -> dict:
        return {"rtd_weight": self.options.rtd_weight}

    def encoder_state(self, state):
        return discriminator_state(state)

    def parts_state(self, state):
        return training_parts(state)

    def load_parts(self, model, parts, where: str) -> None:
        load_training_parts(model, parts, where)

    def eval_model(self, arch: nn.Module) -> ReplacedTokenDetection:
        return self.training_model(copy.deepcopy(arch))  # the training model freezes its discriminator's MLM head

    def scorers(self, model: ReplacedTokenDetection) -> list[Scorer]:
        gen = model.generator
        return [Scorer("detector", "rtd", lambda ids, mask: model.detector(model.encode(ids, mask)).squeeze(-1)),
                Scorer("generator", "mlm", at_positions(lambda ids, mask: gen.trunk(ids, mask), gen.head))]

    def export(self, model: ReplacedTokenDetection, tok, out_dir: Path, eos: str | None) -> str:
        return export_rtd(model, tok, out_dir)

    def load_lines(self, out_dir: Path, cls: str) -> list[str]:
        remote = ", trust_remote_code=True"
        return [f"load with: transformers.AutoModelForPreTraining.from_pretrained('{out_dir}'{remote}) (the discriminator "
                f"and its replaced-token detector); the generator, a masked LM: AutoModelForMaskedLM.from_pretrained("
                f"'{Path(out_dir) / 'generator'}'{remote}). The discriminator has no trained masked-LM head: no fill-mask",
                tokenizer_line(out_dir)]
