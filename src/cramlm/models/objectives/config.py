"""The objectives' configs, torch-free, and their declarations (registry kind ``objective``; each
objective's module registers its builder, base.py's :class:`Objective`).

An objective's config says what can be said of it without building it (class variables: the arch
it trains, its names in the banner, console and report) and holds its options, which a run sets
under ``train.<name>`` (``train.rtd``, ``train.hybrid``); mlm and clm have none."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from cramlm.config.base import Config, PositiveFloat
from cramlm.config.registry import declare


class ObjectiveConfig(Config):
    """The options of an objective (none here) and, as class variables, what is said about it."""

    arch_kind: ClassVar[Literal["mlm", "clm"]] = "mlm"  # the arch it trains: a masked LM or a causal LM
    arch_types: ClassVar[tuple[str, ...] | None] = None  # the arch.type values it builds on (None: any of its kind)
    title: ClassVar[str] = ""  # the banner's words after the name
    loss_title: ClassVar[str] = ""  # the held-out loss in words (report axes and columns)
    train_loss: ClassVar[str] = "train"  # the console's name of the train loss ({key}: from summary.json)
    val_loss: ClassVar[str] = "val_loss: "  # the console's name of the validation loss, before "part of the held-out set"
    heldout_scored_by: ClassVar[str | None] = None  # eval.json's heldout.scored_by, where the label alone does not say
    parts_title: ClassVar[str] = ""  # what the run's trained-parts file holds (objectives that save one)
    # the train config's keys (under ``train``) that decide what the train loss measures: runs of one objective
    # that differ in one have train losses of different tasks (held-out losses compare: heldout-v1 masks all alike)
    train_loss_keys: ClassVar[tuple[str, ...]] = ()
    # the metrics key the report draws as the train curve on the held-out loss's axis (the same task as
    # the validation there), and its words beside "train" when it is not the loss the run minimises
    train_curve: ClassVar[str] = "loss"
    train_curve_title: ClassVar[str] = ""
    # the train keys that decide what that curve measures (None: all of train_loss_keys)
    train_curve_keys: ClassVar[tuple[str, ...] | None] = None


class MLMObjectiveConfig(ObjectiveConfig):
    title: ClassVar[str] = "masked LM"
    loss_title: ClassVar[str] = "MLM"
    train_loss_keys: ClassVar[tuple[str, ...]] = ("mlm_probability",)


class CLMObjectiveConfig(ObjectiveConfig):
    arch_kind: ClassVar[Literal["mlm", "clm"]] = "clm"
    title: ClassVar[str] = "causal LM"
    loss_title: ClassVar[str] = "causal LM"


class RTDConfig(ObjectiveConfig):
    """ELECTRA's replaced-token detection (Clark et al. 2020; train.objective=rtd): a small generator
    (this block) is trained with MLM on the masked batch; its samples replace the masked tokens and
    the model (the arch, the discriminator) learns which tokens were replaced at every position."""

    arch_types: ClassVar[tuple[str, ...] | None] = ("crammed-bert",)  # it wraps a CrammedBert
    title: ClassVar[str] = "ELECTRA: generator MLM + replaced-token detection"
    loss_title: ClassVar[str] = "RTD generator MLM"
    train_loss: ClassVar[str] = "train: generator MLM + {rtd_weight:g} x detector BCE"
    val_loss: ClassVar[str] = "generator MLM on "
    heldout_scored_by: ClassVar[str | None] = "the RTD generator (MLM loss on the heldout-v1 masks)"
    parts_title: ClassVar[str] = "the RTD generator and detector"
    train_loss_keys: ClassVar[tuple[str, ...]] = ("mlm_probability", "rtd.rtd_weight")
    train_curve: ClassVar[str] = "mlm_loss"  # the loss minimised adds rtd_weight x the detector's BCE
    train_curve_title: ClassVar[str] = "generator MLM"
    train_curve_keys: ClassVar[tuple[str, ...] | None] = ("mlm_probability",)  # the generator's task: not rtd_weight

    generator_size: Annotated[float, Field(gt=0, le=1)] = Field(
        0.25, description="the generator's width (hidden size, FFN width, heads at the same head dim) as a "
        "fraction of the discriminator's (ELECTRA: 1/4 to 1/3 works best); same depth. Its head is ELECTRA's "
        "(dense to the embedding width, activation, norm, the tied decoder) whatever arch.head_transform says, "
        "and uncapped (arch.logit_softcap applies to the model's own MLM head, not the generator's)")
    rtd_weight: PositiveFloat = Field(
        50.0, description="loss = generator MLM loss + rtd_weight x discriminator binary cross-entropy (ELECTRA: 50)")


class HybridConfig(ObjectiveConfig):
    """GPT-BERT's hybrid (Charpentier & Samuel 2024; train.objective=hybrid): one encoder trained on
    masked next-token prediction (bidirectional attention; the masked token at i predicted from
    position i-1, at train.mlm_probability) and on causal next-token prediction (causal attention),
    chosen per sequence; it serves as an encoder, a masked LM and a causal LM."""

    arch_types: ClassVar[tuple[str, ...] | None] = ("crammed-bert",)  # it wraps a CrammedBert
    title: ClassVar[str] = "GPT-BERT: masked next-token + causal LM"
    loss_title: ClassVar[str] = "hybrid masked next-token"
    train_loss: ClassVar[str] = "train: masked next-token + causal shares"
    val_loss: ClassVar[str] = "masked next-token on "
    heldout_scored_by: ClassVar[str | None] = ("masked next-token prediction on the heldout-v1 masks (the token at i "
                                               "predicted at position i-1, bidirectional attention)")
    train_loss_keys: ClassVar[tuple[str, ...]] = ("mlm_probability", "hybrid.causal_fraction")
    train_curve_title: ClassVar[str] = "masked next-token + causal shares"  # the causal rows' loss weighted in

    causal_fraction: Annotated[float, Field(ge=0, lt=1)] = Field(
        0.0625, description="share of the training sequences trained as a causal LM (causal attention, next-token "
        "prediction at every position); the others masked next-token prediction at train.mlm_probability "
        "(GPT-BERT: 1 in 16, 15 masked : 1 causal); drawn per sequence, keyed by its stream position")


declare("objective", "mlm", MLMObjectiveConfig)
declare("objective", "clm", CLMObjectiveConfig)
declare("objective", "rtd", RTDConfig)
declare("objective", "hybrid", HybridConfig)
