"""GPT-BERT's hybrid of masked and causal language modelling (Charpentier & Samuel 2024, the BabyLM
2024 winner): ``train.objective=hybrid``. One set of weights, the run's crammed-bert encoder,
trained in two modes that share the output head because both predict the *next* token:

- masked next-token prediction (``1 - train.hybrid.causal_fraction`` of the sequences): the batch
  masked as for MLM (data/collate.py, ``train.mlm_probability``), bidirectional attention, and the
  masked token at position i predicted from the output at position i - 1;
- causal LM (``train.hybrid.causal_fraction``, GPT-BERT: 1 in 16): the original tokens, causal
  attention, every token predicted from the output before it.

Which sequence is which is a keyed draw on its stream position (as the masks are), so resume stays
bitwise and N processes train on what one does. A microbatch is one trunk forward, each row
attending as its mode does; its loss is the two modes' mean losses weighted by their shares of its
sequences (logged as ``masked_loss`` and ``causal_loss``, which sum to it). The model is the arch
itself (its state dict, its names): fine-tuning takes the encoder as for MLM. Held-out loss: the
masked next-token loss on the heldout-v1 masks (labelled ``hybrid``). Zero-shot: the causal
log-probability of the sentence (one forward, exact), the masked mode's pseudo-log-likelihood beside
it. Export: one remote-code folder, a masked LM (logits shifted to the usual positions, so fill-mask
works) and a causal LM over the same weights.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from cramlm.config.registry import register
from cramlm.constants import IGNORE_INDEX
from cramlm.data.collate import stream_positions
from cramlm.data.permute import mix64
from cramlm.models.base import tied_aliases
from cramlm.models.config import trunk_flops_per_token
from cramlm.models.crammed_bert import CrammedBert
from cramlm.models.objectives.base import Objective, Scorer, masked_collator, tokenizer_line
from cramlm.models.objectives.config import HybridConfig

_MODE_SALT = np.uint64(0x3C6EF372FE94F82B)  # the per-sequence mode draw: a stream of its own, apart from the masks'


class HybridCollator:
    """Every sequence masked as for MLM (``masker``), then a keyed draw per sequence: a causal one
    gets its original tokens back, each labelled (padding excepted); ``causal`` (B,) bool says which."""

    def __init__(self, masker, causal_fraction: float, seed: int):
        self.masker, self.fraction = masker, causal_fraction
        self.key = mix64(np.uint64(seed % 2**64) ^ _MODE_SALT)

    def __call__(self, batch, positions=None) -> dict[str, torch.Tensor]:
        original = batch["input_ids"] if isinstance(batch, dict) else batch  # (B, T)
        out = self.masker(batch, positions)
        causal = self.draw(len(original), positions)  # (B,)
        labels = original
        if "attention_mask" in out:
            labels = torch.where(out["attention_mask"] == 0, torch.full_like(original, IGNORE_INDEX), original)
        out["input_ids"] = torch.where(causal[:, None], original, out["input_ids"])
        out["labels"] = torch.where(causal[:, None], labels, out["labels"])
        out["causal"] = causal
        return out

    def draw(self, n: int, positions) -> torch.Tensor:
        """(n,) bool: which sequences are causal; keyed by stream position (None: 0 ... n-1, as the masks)."""
        words = mix64(stream_positions(positions, n).astype(np.int64).astype(np.uint64) ^ self.key)
        u = torch.from_numpy((words >> np.uint64(11)).astype(np.float64) / 2.0**53)  # 53 bits -> [0, 1)
        return u < self.fraction


class GPTBERT(nn.Module):
    """The arch's trunk and MLM head (the arch's own modules and names) trained in GPT-BERT's two
    modes; both predict at position t the token at t + 1."""

    def __init__(self, arch: CrammedBert, causal_fraction: float, mlm_probability: float):
        super().__init__()
        self.trunk, self.head = arch.trunk, arch.head
        self.cfg, self.hidden_size, self.vocab_size = arch.cfg, arch.hidden_size, arch.vocab_size
        self.causal_fraction, self.mlm_probability = causal_fraction, mlm_probability

    def encode(self, input_ids, attention_mask=None, position_ids=None, document_ids=None, token_type_ids=None,
               causal: bool | torch.Tensor = False) -> torch.Tensor:
        """(B, T) -> (B, T, H): bidirectional (the encoder fine-tuning uses), causal, or (``causal`` a
        (B,) bool tensor) causal in those rows."""
        return self.trunk(input_ids, attention_mask, position_ids, document_ids, token_type_ids, causal=causal)

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T): masked rows as for MLM, causal rows the original tokens
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,  # (B, T) the token to predict (at the position before it), -100 elsewhere
        position_ids: torch.Tensor | None = None,
        document_ids: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        causal: torch.Tensor | None = None,  # (B,) bool: the causal rows (None: all masked, e.g. held-out scoring)
    ) -> dict[str, torch.Tensor | None]:
        """{"loss", "logits"}: without labels, the masked mode's (B, T, V) logits, at t those of token
        t + 1; with labels, the loss (the modes' mean losses weighted by their shares of the rows) and
        its two terms, "masked_loss" and "causal_loss" (detached). One trunk forward for both modes
        (each row attends as its mode does), so every process runs the same forwards (FSDP)."""
        context = (attention_mask, position_ids, document_ids, token_type_ids)
        if labels is None:
            return {"loss": None, "logits": self.head(self.encode(input_ids, *context))}
        rows = torch.zeros(len(input_ids), dtype=torch.bool, device=input_ids.device) if causal is None else causal.bool()
        counts = {"masked_loss": int((~rows).sum()), "causal_loss": int(rows.sum())}
        hidden = self.encode(input_ids, *context, causal=rows if counts["causal_loss"] else False)[:, :-1]  # (B, T-1, H)
        targets = labels[:, 1:]  # (B, T-1): position t predicts token t + 1
        scored = targets != IGNORE_INDEX
        if document_ids is not None:  # document attention: a masked row's document-first token has no context
            scored &= ~((document_ids[:, 1:] != document_ids[:, :-1]) & ~rows[:, None])  # in its document: not scored
        loss, out = 0.0, {}
        for (name, count), mine in zip(counts.items(), (~rows, rows)):
            if not count:
                out[name] = torch.zeros((), device=input_ids.device)
                continue
            picked = scored & mine[:, None]
            term = self.head.loss(hidden[picked], targets[picked]) * (count / len(rows))
            loss, out[name] = loss + term, term.detach()
        return {"loss": loss, "logits": None, **out}

    def causal_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T, V): the causal mode's logits, at t those of token t + 1."""
        return self.head(self.encode(input_ids, attention_mask, causal=True))

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token (3 x the forward): the trunk, and the head at the predicted
        positions: the masked share of the rows at the masking rate, the causal share at T - 1 of T."""
        H, V = self.hidden_size, self.vocab_size
        head = (2 * H * H if self.cfg.head_transform else 0) + 2 * H * V
        c = self.causal_fraction
        predicted = (1 - c) * self.mlm_probability + c * (seq_len - 1) / seq_len
        return 3 * (trunk_flops_per_token(self.cfg, seq_len) + predicted * head)


@register("objective", "hybrid", HybridConfig)
class Hybrid(Objective):
    """``train.objective=hybrid``: see the module docstring."""

    name = "hybrid"

    def collator(self, vocab_size: int, seed: int) -> HybridCollator:
        return HybridCollator(masked_collator(self.train, vocab_size, seed), self.options.causal_fraction, seed)

    def training_model(self, arch: nn.Module) -> GPTBERT:
        if not isinstance(arch, CrammedBert):
            raise ValueError(f"train.objective=hybrid: arch.type={arch.cfg.type} is not a crammed-bert encoder")
        return GPTBERT(arch, self.options.causal_fraction, self.train.mlm_probability)

    def scorers(self, model: GPTBERT) -> list[Scorer]:
        def predict(ids, mask, where):  # the token at ``where`` from the output before it
            hidden = model.encode(ids, mask)  # (B, T, H)
            return model.head(hidden[torch.arange(len(ids), device=ids.device), where - 1])  # (B, V)

        return [Scorer("log-probability", "clm", model.causal_logits, full_logits=True), Scorer("pll", "mlm", predict)]

    def export(self, model: GPTBERT, tok, out_dir: Path, eos: str | None) -> str:
        from cramlm.models.hf import write_tokenizer
        from cramlm.models.hf_remote import write_remote

        special = write_tokenizer(tok, out_dir, model.cfg.max_seq_length)
        classes = {"AutoModelForMaskedLM": "CramlmHybridForMaskedLM", "AutoModelForCausalLM": "CramlmHybridForCausalLM",
                   "AutoModelForSequenceClassification": "CramlmForSequenceClassification",
                   "AutoModelForTokenClassification": "CramlmForTokenClassification"}
        write_remote(out_dir, classes, model.cfg, "hybrid", model.vocab_size, special, model.state_dict(),
                     tied_aliases(model), tie_word_embeddings=model.cfg.tie_embeddings)
        return "CramlmHybridForMaskedLM"

    def load_lines(self, out_dir: Path, cls: str) -> list[str]:
        remote = ", trust_remote_code=True"
        return [f"load with: transformers.AutoModelForMaskedLM.from_pretrained('{out_dir}'{remote}) (masked mode: "
                f"fill-mask), or AutoModelForCausalLM.from_pretrained('{out_dir}'{remote}) (causal mode: the same "
                "weights, next-token log-probabilities)", tokenizer_line(out_dir)]
