"""A run built from its config, in one place: its data, the objective's batches and training model
around the arch, the held-out sequences its val_loss scores (``cramlm pretrain``, the planner's
throughput probe), and a finished run folder read back as (model, tokenizer, config) (``cramlm
eval``, ``cramlm export``, sweeps). torch is imported inside the functions."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from cramlm.data.prepare import prepare_data
from cramlm.data.tokenizer import check_special_ids
from cramlm.io import CheckpointFileError, load_error_reason, safetensors_shapes
from cramlm.models.base import build_model, takes_document_ids
from cramlm.run.config import PretrainConfig

if TYPE_CHECKING:
    import torch


def load_data(cfg: PretrainConfig, dist, resuming: bool = False):
    """The prepared data (rank 0 prepares or finds it first, the others then load it). ``resuming``:
    the run continues from a checkpoint (data/prepare.py's ``reuse_prepared``)."""
    from cramlm.train.distributed import barrier

    if not dist.main:
        barrier(dist)
    data = prepare_data(cfg.data, cfg.impl.data_cache, progress=cfg.impl.progress and dist.main, resuming=resuming)
    if dist.main:
        barrier(dist)
    if cfg.arch.objective == "mlm":  # causal LMs take any tokenizer, e.g. GPT-2's own (data.tokenizer.path)
        check_special_ids(data.tokenizer, f"{data.folder}/tokenizer.json (masked-LM batches need cramlm's special ids)")
    return data


def run_model(cfg: PretrainConfig, vocab_size: int, device, move: bool = True) -> torch.nn.Module:
    """The run's model, on ``device`` (``move=False``: left on the host, as FSDP2 wants it: it moves
    each block to the device as it shards it, so the whole model never has to fit one device)."""
    from cramlm.models.objectives.base import build_objective

    model = build_objective(cfg).training_model(build_model(cfg.arch, vocab_size))  # e.g. ELECTRA's around the arch
    if move:
        model = model.to(device)
    if cfg.train.document_attention and not takes_document_ids(model):
        raise ValueError(f"train.document_attention=true: arch.type={cfg.arch.type} takes no document_ids "
                         "(its forward has no such argument); set train.document_attention=false")
    return model


def make_collator(cfg: PretrainConfig, vocab_size: int, seed: int):
    """The batches the run's objective trains on (models/objectives/)."""
    from cramlm.models.objectives.base import build_objective

    return build_objective(cfg).collator(vocab_size, seed)


def validation_set(cfg: PretrainConfig, data, vocab_size: int):
    """val_loss's sequences: the first train.validate_sequences of the held-out set that
    `cramlm eval` scores in full (data/heldout.py defines it); None without validation."""
    from cramlm.data.heldout import run_heldout_set

    heldout = run_heldout_set(cfg, data.val, vocab_size, data.folder / "val.cramtok")
    return heldout.first(cfg.train.validate_sequences) if heldout is not None and cfg.train.validate_sequences else None


def load_run(run_dir: str | Path, device: torch.device | str = "cpu", untrained: bool = False):
    """(model, tokenizer, config) of a finished run folder; ``untrained``: the model freshly
    initialised from the current RNG state instead of the run's weights (its untrained twin)."""
    from cramlm.config.loader import load_yaml, validate
    from cramlm.data.tokenizer import load_tokenizer
    from cramlm.train.checkpoint import load_weights, verified_weights

    run_dir = Path(run_dir)
    if not untrained and not (run_dir / "model.safetensors").is_file():
        raise FileNotFoundError(f"{run_dir}: no model.safetensors (not a finished cramlm run)")
    cfg = validate(PretrainConfig, load_yaml(run_dir / "config.yaml", "run config"))
    tok = load_tokenizer(run_dir)
    model = build_model(cfg.arch, tok.get_vocab_size())
    if untrained:
        return model.to(device), tok, cfg
    weights = run_dir / "model.safetensors"
    shapes = safetensors_shapes(weights)  # a truncated or damaged file: one line naming it
    verified_weights(weights)  # then a changed one (against the run's digests.json, if any)
    try:
        load_weights(model, weights)
    except RuntimeError as e:  # shapes that do not fit the model its config.yaml (and tokenizer.json) describe
        trained = _trained_vocab(model, shapes, tok.get_vocab_size())
        if trained is not None:
            raise CheckpointFileError(
                f"{run_dir / 'tokenizer.json'}: a vocabulary of {tok.get_vocab_size():,} tokens, but {weights} was trained "
                f"with {trained:,}: the tokenizer is not this run's (replaced, or from another data preparation)") from None
        raise CheckpointFileError(f"{weights}: does not fit the model of {run_dir / 'config.yaml'} ({load_error_reason(e)})") from None
    return model.to(device), tok, cfg


def _trained_vocab(model: torch.nn.Module, shapes: dict[str, tuple[int, ...]], vocab: int) -> int | None:
    """The vocabulary size the weights file was trained with, when that alone is what differs from
    the model built for ``vocab`` tokens (every mismatched tensor differs in a dimension of
    ``vocab``, all by the same other size); else None."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    other: set[int] = set()
    for key, shape in shapes.items():
        want = expected.get(key)
        if want is None or want == shape:
            continue
        if len(want) != len(shape):
            return None
        diff = [(w, g) for w, g in zip(want, shape) if w != g]
        if not all(w == vocab for w, _ in diff):
            return None
        other.update(g for _, g in diff)
    return other.pop() if len(other) == 1 else None
