"""An objective defined in this test file alone (one class and one registration, loaded as a plugin:
``plugins=[<this module>] train.objective=aux-mlm``) trains, resumes bit for bit
and evaluates (held-out loss, minimal pairs, fine-tuning) through the Objective interface
(models/objectives/base.py): nothing else in cramlm names it.

The objective: MLM plus an auxiliary head that learns which positions were masked; the head is a
trained part the arch lacks (``aux.safetensors`` beside model.safetensors, as ELECTRA's generator
and detector), and the model has no FLOP count of its own (the trainer counts one step)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from cramlm.config.registry import register
from cramlm.constants import IGNORE_INDEX
from cramlm.models.objectives.base import Objective, Scorer, at_positions, masked_collator
from cramlm.models.objectives.config import ObjectiveConfig

from .helpers import evaluate_tiny, losses, records, run_inprocess

PAIRS = Path(__file__).parents[1] / "eval" / "fixtures" / "minimal_pairs"
PLUGIN = [f"plugins=[{__name__}]", "train.objective=aux-mlm", "budget=null"]  # this module, as pytest imported it
STEPS = [*PLUGIN, "train.budget.steps=4", "train.checkpoint_every=2", "train.keep_checkpoints=5"]


class AuxConfig(ObjectiveConfig):
    title: ClassVar[str] = "test: MLM + masked-position detection"
    loss_title: ClassVar[str] = "aux MLM"
    heldout_scored_by: ClassVar[str | None] = "the arch's MLM head on the heldout-v1 masks"
    parts_title: ClassVar[str] = "the auxiliary head"
    train_loss_keys: ClassVar[tuple[str, ...]] = ("mlm_probability", "objective_options.aux_weight")
    train_curve: ClassVar[str] = "mlm_loss"  # the loss minimised adds aux_weight x the detection loss
    train_curve_title: ClassVar[str] = "MLM"

    aux_weight: float = 0.5


class MaskedWithAux(nn.Module):
    """The arch (a CrammedBert) and a head predicting, per position, whether it was masked."""

    def __init__(self, arch: nn.Module, weight: float):
        super().__init__()
        self.arch, self.weight, self.cfg = arch, weight, arch.cfg
        self.hidden_size, self.vocab_size = arch.hidden_size, arch.vocab_size
        self.aux = nn.Linear(arch.hidden_size, 1)

    def encode(self, input_ids, attention_mask=None):
        return self.arch.encode(input_ids, attention_mask)

    def forward(self, input_ids, attention_mask=None, labels=None):
        hidden = self.encode(input_ids, attention_mask)  # (B, T, H)
        if labels is None:
            return {"loss": None, "logits": self.arch.head(hidden)}
        scored = labels != IGNORE_INDEX
        mlm = self.arch.head.loss(hidden[scored], labels[scored])
        aux = F.binary_cross_entropy_with_logits(self.aux(hidden).squeeze(-1).float(), scored.float())
        return {"loss": mlm + self.weight * aux, "logits": None, "mlm_loss": mlm.detach(), "aux_loss": aux.detach()}


@register("objective", "aux-mlm", AuxConfig)
class AuxMLM(Objective):
    name = "aux-mlm"
    trained_parts = "aux.safetensors"

    def collator(self, vocab_size, seed):
        return masked_collator(self.train, vocab_size, seed)

    def training_model(self, arch):
        return MaskedWithAux(arch, self.options.aux_weight)

    def encoder_state(self, state):
        return {k.removeprefix("arch."): v for k, v in state.items() if k.startswith("arch.")}

    def parts_state(self, state):
        return {k: v for k, v in state.items() if k.startswith("aux.")}

    def load_parts(self, model, parts, where):
        model.aux.load_state_dict({k.removeprefix("aux."): v for k, v in parts.items()})

    def scorers(self, model):
        return [Scorer("pll", "mlm", at_positions(model.encode, model.arch.head))]


def final_state(run_dir: Path) -> dict:
    return load_file(f"{json.loads((run_dir / 'summary.json').read_text())['final_checkpoint']}/model.safetensors")


def test_a_plugin_objective_trains_and_saves_the_arch_and_its_trained_parts(tmp_path):
    summary = run_inprocess(tmp_path, "aux", *PLUGIN, "train.budget.steps=30", "train.optim.lr=3e-3")
    got = losses(tmp_path / "aux")
    assert sum(got[s] for s in (28, 29, 30)) < sum(got[s] for s in (1, 2, 3)) - 0.5, got
    assert summary["objective"] == "aux-mlm" and summary["flops_source"] == "FlopCounterMode"
    lines = records(tmp_path / "aux")  # its parts logged beside the loss, which they make up
    assert all(abs(r["loss"] - r["mlm_loss"] - 0.5 * r["aux_loss"]) < 1e-4 for r in lines)
    trained = final_state(tmp_path / "aux")
    saved, aux = (load_file(str(tmp_path / "aux" / f)) for f in ("model.safetensors", "aux.safetensors"))
    assert sorted(aux) == ["aux.bias", "aux.weight"] and torch.equal(aux["aux.weight"], trained["aux.weight"])
    assert saved and all(torch.equal(v, trained[f"arch.{k}"]) for k, v in saved.items())  # the arch's own names
    assert set(json.loads((tmp_path / "aux" / "digests.json").read_text())["files"]) >= {"model.safetensors", "aux.safetensors"}


def test_a_plugin_objective_resumes_bitwise(tmp_path):
    run_inprocess(tmp_path, "ref", *STEPS)
    shutil.copytree(tmp_path / "ref" / "checkpoints" / "step-00000002", tmp_path / "resumed" / "checkpoints" / "step-00000002")
    assert run_inprocess(tmp_path, "resumed", *STEPS, "resume=auto")["steps"] == 4
    a, b = final_state(tmp_path / "ref"), final_state(tmp_path / "resumed")
    assert "aux.weight" in a and a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert losses(tmp_path / "resumed") == {s: v for s, v in losses(tmp_path / "ref").items() if s > 2}


def test_a_plugin_objective_evaluates(tmp_path, monkeypatch):
    run_inprocess(tmp_path, "aux", *PLUGIN, "train.budget.steps=3")
    got = evaluate_tiny(tmp_path / "aux", PAIRS, monkeypatch)
    assert got["heldout"]["objective"] == "aux-mlm" and "MLM head" in got["heldout"]["scored_by"]
    assert 0 < got["heldout"]["loss"] < 20
    assert got["minimal_pairs"]["headline"] == "pll-word-l2r" and got["minimal_pairs"]["scores"]["pll-word-l2r"]["pairs"] == 8
    assert [r["task"] for r in got["results"]] == ["whales"] and 0 <= got["results"][0]["score"] <= 100
    from cramlm.report.rundata import load_run_data  # the report reads what the plugin's config says of it

    run = load_run_data(tmp_path / "aux")
    assert run.train_task == {"mlm_probability": 0.25, "objective_options.aux_weight": 0.5}  # its class's default
    assert run.train_curve == ("mlm_loss", "MLM")


def test_a_plugin_objectives_options_are_set_in_the_config_and_checked_by_its_class():
    """train.objective_options: the plugin's own fields (its config class checks them: a typo names
    the key); written to a run's config only when set; the built-in objectives keep their blocks."""
    import pytest

    from cramlm.config.loader import ConfigError, resolve
    from cramlm.models.objectives.base import build_objective
    from cramlm.run.config import PretrainConfig
    from cramlm.run.pretrain import DEFAULTS

    def config(*overrides: str):
        return resolve(PretrainConfig, DEFAULTS, [*PLUGIN, *overrides])

    assert build_objective(config("train.objective_options.aux_weight=2.0")).options.aux_weight == 2.0
    assert build_objective(config()).options.aux_weight == 0.5
    assert "objective_options" not in config().model_dump(mode="json")["train"]
    assert config("train.objective_options.aux_weight=2.0").model_dump(mode="json")["train"]["objective_options"] == {
        "aux_weight": 2.0}
    with pytest.raises(ConfigError, match=r"train.objective_options.aux_wieght: unknown key. Did you mean "
                       r"'train.objective_options.aux_weight'\? Known keys here: aux_weight"):  # as any other key
        config("train.objective_options.aux_wieght=2.0")
    with pytest.raises(ConfigError, match=r"train.objective_options.weight: unknown key. mlm takes no options"):
        resolve(PretrainConfig, DEFAULTS, ["train.objective=mlm", "train.objective_options.weight=2.0"])
    with pytest.raises(ConfigError, match=r"train.objective=rtd takes its options in train.rtd"):
        resolve(PretrainConfig, DEFAULTS, ["train.objective=rtd", "train.objective_options.weight=2.0"])
