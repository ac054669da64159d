"""Small torch-free helpers shared by every stage: atomic file writes, packaged resources and the
"did you mean" hint of error messages.

Every file cramlm writes under its final name is written beside it first and renamed when complete
(:func:`atomic_write`), so a crash, even a SIGKILL in the middle of a write, never leaves a broken
file under that name. Importing this module imports no torch (tests/test_architecture.py), so a
config, a record or a report is written without paying for it.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any

PKG_SCHEME = "pkg://"  # pkg://<path>: a file or folder shipped in cramlm/resources


def atomic_path(path: Path) -> Path:
    """The temporary name ``path`` is written under (hidden, per process) before the rename."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


@contextmanager
def atomic_write(path: str | Path) -> Iterator[Path]:
    """``with atomic_write(path) as tmp:`` write ``tmp``; it becomes ``path`` when the block ends
    normally, and is removed when it raises."""
    path = Path(path)
    tmp = atomic_path(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path: str | Path, text: str) -> None:
    with atomic_write(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | Path, obj: Any, indent: int | None = 2) -> None:
    write_text(path, json.dumps(obj, indent=indent) + "\n")


def save_safetensors(tensors: dict, path: str | Path, metadata: dict | None = None) -> None:
    """``safetensors.save_file``, atomically and with the permissions of any new file (it creates
    0600 files; run folders and exports are meant to be shared like the rest: 0666 less the umask).
    safetensors (and torch) are imported only when called."""
    from safetensors.torch import save_file

    with atomic_write(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)
        os.chmod(tmp, 0o666 & ~umask())


def umask() -> int:
    """The process umask."""
    try:  # Linux: read it, rather than set and restore it (which races with other threads)
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def package_path(spec: str) -> Path:
    """``pkg://<path>`` as the path of that shipped resource; any other string as a user path."""
    if spec.startswith(PKG_SCHEME):
        return Path(str(resources.files("cramlm") / "resources" / spec[len(PKG_SCHEME) :]))
    return Path(spec).expanduser()


# Hugging Face's names (TrainingArguments, run_glue.py, BERT configs) -> cramlm's, tried in order: the
# first whose first part is a key here is suggested (``eval.learning_rate`` -> ``eval.lr``,
# ``train.learning_rate`` -> ``train.optim.lr``); the spelling is too far apart for difflib.
HF_NAMES: dict[str, tuple[str, ...]] = {
    "learning_rate": ("lr", "optim.lr"),
    "num_train_epochs": ("epochs",),
    "num_epochs": ("epochs",),
    "per_device_train_batch_size": ("batch_size",),
    "train_batch_size": ("batch_size",),
    "per_device_eval_batch_size": ("eval_batch_size",),
    "eval_batch_size": ("eval_batch_size",),
    "weight_decay": ("weight_decay", "optim.weight_decay"),
    "warmup_ratio": ("warmup",),
    "warmup_steps": ("warmup",),
    "lr_scheduler_type": ("schedule",),
    "max_grad_norm": ("grad_clip",),
    "adam_beta1": ("betas", "optim.betas"),
    "adam_beta2": ("betas", "optim.betas"),
    "adam_epsilon": ("eps", "optim.eps"),
    "max_steps": ("budget.steps",),
    "max_length": ("max_seq_length",),
    "model_max_length": ("max_seq_length",),
    "max_train_samples": ("max_train_examples",),
    "max_eval_samples": ("max_dev_examples",),
    "classifier_dropout": ("dropout",),
    "hidden_dropout_prob": ("dropout",),
    "attention_probs_dropout_prob": ("attention_dropout",),
    "num_hidden_layers": ("num_layers",),
    "num_attention_heads": ("num_heads",),
    "max_position_embeddings": ("max_seq_length",),
    "seed": ("seed",),
}


def did_you_mean(word: Any, known: Iterable[str], prefix: str = "") -> str:
    """`` Did you mean '<prefix><closest>'?`` for an error message, or "" when nothing is close
    (Hugging Face's names for a key, HF_NAMES, first)."""
    known = list(known)
    alias = next((a for a in HF_NAMES.get(str(word), ()) if a.split(".")[0] in known), None)
    if alias is not None:
        return f" Did you mean '{prefix}{alias}'? ('{word}' is Hugging Face's name)"
    close = difflib.get_close_matches(str(word), known, n=1)
    return f" Did you mean '{prefix}{close[0]}'?" if close else ""


def user_cache() -> Path:
    """cramlm's per-user cache folder: ``$CRAMLM_CACHE``, else ``$XDG_CACHE_HOME/cramlm``, else
    ``~/.cache/cramlm`` (prepared data in ``data/``, the hardware probe in ``hardware.json``)."""
    if os.environ.get("CRAMLM_CACHE"):
        return Path(os.environ["CRAMLM_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cramlm"
