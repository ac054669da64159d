"""``cramlm export hf``: a run or checkpoint as a Hugging Face folder."""

from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import click

from cramlm.cli.common import run_or_exit


@click.group("export")
def export_command() -> None:
    """Export checkpoints to other formats."""


def resolve_checkpoint(run_or_checkpoint: str) -> tuple[Path, Path]:
    """(run folder with config.yaml + tokenizer.json, weights file). Accepts a run folder, a
    weights file inside one, a run's checkpoint folder (``<run>/checkpoints/step-*``) or its
    model.safetensors, or a run name under ./outputs."""
    from cramlm.run.folder import named_run

    path = named_run(run_or_checkpoint)
    folder = path.parent if path.is_file() else path
    if (folder / "state.json").is_file() and not (folder / "config.yaml").is_file():  # a checkpoint of a run
        return folder.parent.parent, folder / "model.safetensors"
    if path.is_file():
        return path.parent, path
    if path.is_dir():
        return path, path / "model.safetensors"
    raise FileNotFoundError(f"{run_or_checkpoint}: no such run folder or checkpoint file")


def export_run(run_or_checkpoint: str, out_dir: str) -> str:
    """Export a run or one of its checkpoints; a sharded checkpoint's weights are assembled first (on
    this process, a tensor at a time, into a temporary file beside the output, removed afterwards)."""
    import tempfile

    from cramlm.io import on_full_disk
    from cramlm.train.checkpoint import assemble_weights
    from cramlm.train.sharded import is_sharded

    run_dir, weights = resolve_checkpoint(run_or_checkpoint)
    check_output_folder(Path(out_dir), run_dir)  # before any work
    with exporting(Path(out_dir)), on_full_disk(out_dir, f"{out_dir}: disk full while exporting {run_dir.name} ({{free}}); nothing of the export was "
                      "kept and the folder is as it was: free some space or export elsewhere"):  # safetensors' own error too
        if weights.is_file() or not is_sharded(weights.parent):
            return export_weights(run_dir, weights, out_dir)
        out = Path(out_dir).resolve()  # (a symlinked output folder: beside its target, where `exporting` looks; it made the parent)
        with tempfile.TemporaryDirectory(prefix=f".{out.name}.assembled-", dir=out.parent) as tmp:  # beside the output
            return export_weights(run_dir, assemble_weights(weights.parent, Path(tmp)), out_dir)


def export_weights(run_dir: Path, weights: Path, out_dir: str) -> str:
    """Export the run ``run_dir`` with the weights file ``weights`` (its own, or a checkpoint's): what
    its objective trained (models/objectives/: the arch; ELECTRA's discriminator with its detector,
    and its generator), written as the objective exports it."""
    from cramlm.data.tokenizer import separator_id
    from cramlm.models.hf import segments_as_trained
    from cramlm.models.objectives.base import build_objective
    from cramlm.run.build import load_run

    own = weights == run_dir / "model.safetensors"
    # a checkpoint's weights replace every parameter: the run's own final file is not needed (a run
    # still training, or killed, has none yet)
    model, tok, cfg = load_run(run_dir, untrained=not own)
    objective = build_objective(cfg)
    if not own:  # (load_run checked the run's own against its digest)
        from cramlm.eval.checkpoints import load_encoder

        load_encoder(model, objective, weights)
    model = objective_export_model(run_dir, objective, model, weights)
    segments_as_trained(model)  # a tokenizer's pairs give segment 1 after [SEP]; the run trained segment 0 alone
    # a causal LM ends documents with the run's separator: the export's eos (also bos and pad)
    eos = tok.id_to_token(separator_id(tok, cfg.data.tokenizer.separator)) if objective.config.arch_kind == "clm" else None
    out = Path(out_dir)  # (checked by export_run, before any work)
    with export_folder(out) as tmp:
        cls = objective.export(model.eval(), tok, tmp, eos)
        remote = ", trust_remote_code=True" if cls.startswith("Cramlm") else ""
        lines = objective.load_lines(out, cls)
        lines.append(f"also: {', '.join(served_classes(tmp, objective.auto_class))}.from_pretrained(... same "
                     "arguments) (the encoder alone; classification heads new, to fine-tune)")
        if eos is not None:
            lines.append(f"generate: transformers.pipeline('text-generation', '{out_dir}'{remote}) (stops at {eos})")
        write_model_card(tmp, run_dir, cfg, cls, lines)
    click.echo(f"exported {run_dir} as {cls} to {out_dir}")
    for line in lines:
        click.echo(line)
    return cls


@contextmanager
def exporting(out: Path) -> Iterator[None]:
    """One export into ``out`` at a time (a lock file beside it, removed afterwards; inside it where its
    parent takes no files, as a mount point's may not; a second export is refused, naming the first),
    and what a killed export left first removed: its assembled weights (``.<out>.assembled-*``) and its
    half-written folder (``.<out>.tmp-<pid>`` beside it, or ``.export.tmp-<pid>`` inside it), each as
    large as the model."""
    from cramlm.io import atomic_path, remove_leftover
    from cramlm.locks import FolderLock

    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    beside = os.access(out.parent, os.W_OK) or not out.is_dir()
    lock = FolderLock(out.with_name(f".{out.name}.export-lock") if beside else out / ".export.lock", f"export folder {out}")
    with lock:
        stale = [*out.parent.glob(f".{out.name}.assembled-*"), *out.parent.glob(atomic_path(out, "*").name),
                 *(out.glob(".export.tmp-*") if out.is_dir() else [])]
        for path in sorted(stale):
            size = remove_leftover(path)
            click.echo(f"cramlm: removed {path} ({size / 1e6:,.1f} MB), left by an export into {out.name} that was stopped")
        try:
            yield
        finally:
            lock.path.unlink(missing_ok=True)


EXPORTED = ".cramlm-export.json"  # the entries an export wrote: the next export into the folder replaces just these


@contextmanager
def export_folder(out: Path) -> Iterator[Path]:
    """``with export_folder(out) as tmp:`` write the export into ``tmp``; when the block ends it is put
    in place, and when it raises nothing of ``out`` has changed. A new folder appears whole (renamed
    into place). Into an existing one (an earlier export, a clone of a Hugging Face repository, a
    mount point, a symlink's target) each entry the export wrote replaces its namesake and the
    entries of the earlier cramlm export it no longer writes go; anything else (``.git``, the user's
    own files) stays."""
    from cramlm.io import atomic_dir

    out = out.resolve()  # a symlinked output folder: its target, the link left as it is
    if not out.is_dir():
        out.parent.mkdir(parents=True, exist_ok=True)
        with atomic_dir(out) as tmp:
            yield tmp
            _record_entries(tmp)
        return
    tmp = out / f".export.tmp-{os.getpid()}"  # inside it: the same filesystem, even for a mount point
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        written = _record_entries(tmp)
        earlier = _recorded_entries(out)
        # before anything is replaced: an entry of another kind where the export writes (a file of the
        # user's where a folder goes) that no earlier export wrote is refused, the folder as it was
        for name in written:
            target = out / name
            if name not in earlier and target.exists() and target.is_dir() != (tmp / name).is_dir():
                raise ValueError(f"{target}: a {'folder' if target.is_dir() else 'file'} where the export writes a "
                                 f"{'folder' if (tmp / name).is_dir() else 'file'}: move it, or export into another folder")
        for name in [*written, EXPORTED]:
            _remove(out / name)
            os.replace(tmp / name, out / name)
        for name in sorted(set(earlier) - set(written)):
            _remove(out / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():  # a file, or a link (to a folder too)
        path.unlink()


def _record_entries(folder: Path) -> list[str]:
    names = sorted(p.name for p in folder.iterdir() if p.name != EXPORTED)
    (folder / EXPORTED).write_text(json.dumps({"entries": names}, indent=1) + "\n", encoding="utf-8")
    return names


def _recorded_entries(folder: Path) -> list[str]:
    """The entries the earlier cramlm export into ``folder`` wrote ([] if none was recorded, or the
    record is not one): plain names only, never a hidden one (``.git``) or the record itself."""
    try:
        names = json.loads((folder / EXPORTED).read_text(encoding="utf-8")).get("entries", [])
    except (OSError, ValueError, AttributeError):
        return []
    if not isinstance(names, list):
        return []
    return [n for n in names if isinstance(n, str) and n and not n.startswith(".") and "/" not in n and "\\" not in n]


def check_output_folder(out: Path, run_dir: Path) -> None:
    """Refuse an output folder an export would write into and that is not a model folder: the run
    itself (or a folder holding it), or a folder of other files (the export's files replace their
    namesakes: it may be new, empty, hold hidden entries alone such as a fresh clone's ``.git``, or be
    an earlier export / Hugging Face model folder)."""
    target, run = out.resolve(), run_dir.resolve()
    if target == run or target in run.parents:
        raise ValueError(f"{out}: the export would replace the run folder {run_dir}: export into a folder of its own")
    if target.is_file():
        raise ValueError(f"{out}: a file; export into a folder")
    held = sorted(p.name for p in target.iterdir() if not p.name.startswith(".")) if target.is_dir() else []
    if held and not (target / "config.json").is_file():
        raise ValueError(f"{out}: holds other files ({', '.join(held[:3])}{', ...' if len(held) > 3 else ''}) and no "
                         "config.json: an export writes a model folder; export into a new or empty folder, or a model folder")


def served_classes(out_dir: Path, first: str) -> list[str]:
    """The transformers Auto classes besides the headline one that load the export: its auto_map's
    (remote code), else those transformers maps to the stock architecture."""
    import json

    config = json.loads((out_dir / "config.json").read_text(encoding="utf-8"))
    named = [k for k in (config.get("auto_map") or {}) if k != "AutoConfig"]
    if not named:
        named = ["AutoModel", "AutoModelForSequenceClassification", "AutoModelForTokenClassification"]
    return [k for k in named if k != first]


def write_model_card(out_dir: Path, run_dir: Path, cfg, cls: str, load_lines: list[str]) -> None:
    """``out_dir/README.md``: what the export is (model, objective, training, data), how to load it."""
    import json

    from cramlm.io import write_text

    try:
        summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        summary = {}
    objective = summary.get("objective") or cfg.train.objective
    trained = (f"{summary['steps']:,} optimizer steps, {summary['tokens']:,} tokens"
               if isinstance(summary.get("steps"), int) and isinstance(summary.get("tokens"), int) else "see the run folder")
    val = summary.get("val_loss")
    card = [
        "---", "library_name: transformers", f"tags: [cramlm, {objective}]", "---", "",
        f"# {run_dir.name}", "",
        f"A {cfg.arch.type} model pretrained with cramlm (objective `{objective}`) and exported by "
        f"`cramlm export hf` as `{cls}`.", "",
        f"- parameters: {summary.get('parameters', 'n/a'):,}" if isinstance(summary.get("parameters"), int)
        else "- parameters: n/a",
        f"- training: {trained}; budget {summary.get('budget', 'n/a')}",
        f"- data: `{cfg.data.name}`, {cfg.data.seq_length}-token sequences; tokenizer: "
        f"{summary.get('tokenizer', 'the run tokenizer')}",
        f"- validation loss at the end of training: {val:.4f}" if isinstance(val, float) else "- validation loss: n/a",
        "", "## Load", "", *[f"    {line}" for line in load_lines], "",
        "A small model trained briefly: for research and tests of the pipeline, not for use in products. "
        "The full resolved config is the run's `config.yaml`.", "",
    ]
    write_text(out_dir / "README.md", "\n".join(card))


def objective_export_model(run_dir: Path, objective, encoder, weights: Path):
    """The objective's trained model around ``encoder`` for export: with the trained parts of the same
    weights (a checkpoint's own file, else the run's parts file) where it has them."""
    from cramlm.eval.checkpoints import load_trained_parts, trained_parts_file

    model = objective.eval_model(encoder)
    if not objective.trained_parts:
        return model
    source = weights if weights != run_dir / "model.safetensors" else trained_parts_file(run_dir, objective.trained_parts)
    if source is None:
        raise FileNotFoundError(f"{run_dir}: train.objective={objective.name}, but no {objective.trained_parts} holds "
                                f"{objective.config.parts_title}; export a checkpoint of the run instead "
                                "(checkpoints/step-.../model.safetensors), retrain the run, or fine-tune the run itself "
                                "(its model.safetensors has the encoder)")
    load_trained_parts(objective, model, source)
    return model


@export_command.command("hf")
@click.argument("run_or_checkpoint")
@click.argument("out_dir")
def export_hf_command(run_or_checkpoint: str, out_dir: str) -> None:
    """Write RUN_OR_CHECKPOINT (a run folder, a weights file in one, or a run name) to OUT_DIR as
    safetensors + config.json + tokenizer files that transformers' from_pretrained loads offline.
    Stock classes where the architecture is exact (BERT, ModernBERT, GPT-2, Llama), else a
    remote-code package (trust_remote_code=True)."""
    run_or_exit(export_run, run_or_checkpoint, out_dir)
