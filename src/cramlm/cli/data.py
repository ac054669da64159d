"""``cramlm data ...``: the data stage on its own.

    cramlm data prepare data=default                       # the whole chain, cached by config hash
    cramlm data prepare data=the-pile --num-shards 8 --shard-index 3   # one shard (Slurm array task)
    cramlm data merge data=the-pile --num-shards 8         # then merge the shards
    cramlm data tokenizer data=default --out tok.json      # train the configured tokenizer only
    cramlm data index corpus.jsonl                         # raw byte-offset index (.idx.npy)
    cramlm data dedup data=default --out deduped.jsonl     # exact/near dedup of the sources
    cramlm data pack corpus.jsonl --tokenizer tok.json --out corpus.cramtok
    cramlm data inspect outputs/data/moby-dick-<key>/      # stats and decoded samples
    cramlm data convert-modalities data.pbin data.cramtok --tokenizer tok.json
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from cramlm.cli.common import OVERRIDES, resolve_or_exit, run_or_exit


def _echo(obj: dict) -> None:
    click.echo(json.dumps(obj))



def _writable(out: str, reads: list[str | Path] = ()) -> str:
    """``out``, after checking that its folder exists and that it is none of the files the command
    reads (``reads``: paths, folders or globs), before any work is done: an output never replaces an input."""
    target = Path(out).expanduser().resolve()
    if not target.parent.is_dir():
        raise click.ClickException(f"{out}: cannot write there, folder {target.parent} does not exist")
    from cramlm.data.sources import DataError, expand_paths

    for spec in reads:
        try:
            files = expand_paths(str(spec)) if not Path(spec).is_file() else [Path(spec)]
        except DataError:
            continue  # no such input: the command says so itself
        if any(f.resolve() == target for f in files):
            raise click.ClickException(f"{out}: is a file this command reads ({spec}); write the output to another file")
    return out


@click.group("data")
def data_command() -> None:
    """The data stage on its own: prepare, shard and merge, index, tokenizer, dedup, pack, inspect."""


@data_command.command("prepare", context_settings=OVERRIDES)
@click.option("--num-shards", type=click.IntRange(min=1), default=1, help="Split the records into N shards (N machines).")
@click.option("--shard-index", type=click.IntRange(min=0), default=None, help="Prepare only this shard (then run `merge`).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
def prepare(num_shards: int, shard_index: int | None, quiet: bool, overrides: tuple[str, ...]) -> None:
    """Read sources, train the tokenizer, write packed train/val files (cached by config hash).

    Example: cramlm data prepare data=default data.tokenizer.vocab_size=4096 cache=outputs/data
    (cache=: the folder `cramlm run` and `cramlm pretrain` name impl.data_cache; unset: the per-user cache)
    """
    from cramlm.data.prepare import merge_prepared, prepare_data, prepare_shard

    cfg = resolve_or_exit("data", overrides)
    if shard_index is not None:
        info = run_or_exit(prepare_shard, cfg.data, cfg.cache, num_shards, shard_index, not quiet)
        _echo({k: info[k] for k in ("shard", "read", "packed", "skipped", "splits")})
        return
    if num_shards > 1:  # all shards here, one after the other (same result as one shard)
        for i in range(num_shards):
            run_or_exit(prepare_shard, cfg.data, cfg.cache, num_shards, i, not quiet)
        prepared = run_or_exit(merge_prepared, cfg.data, cfg.cache, num_shards)
    else:
        prepared = run_or_exit(prepare_data, cfg.data, cfg.cache, not quiet)
    _summary(prepared)


def _summary(prepared) -> None:
    m = prepared.manifest
    _echo({"folder": str(prepared.folder), **m["documents"], "train_tokens": m["train"]["tokens"],
           "val_tokens": m["val"]["tokens"], "skipped_reasons": m["skipped"]})


@data_command.command("merge", context_settings=OVERRIDES)
@click.option("--num-shards", type=click.IntRange(min=1), required=True)
@click.option("--keep-shards", is_flag=True, help="Keep the shard folders after merging.")
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
def merge(num_shards: int, keep_shards: bool, overrides: tuple[str, ...]) -> None:
    """Merge the finished shards of `prepare --num-shards N --shard-index i` into the output folder."""
    from cramlm.data.prepare import merge_prepared

    cfg = resolve_or_exit("data", overrides)
    _summary(run_or_exit(merge_prepared, cfg.data, cfg.cache, num_shards, keep_shards))


@data_command.command("tokenizer", context_settings=OVERRIDES)
@click.option("--out", type=click.Path(dir_okay=False), required=True, help="Where to write tokenizer.json.")
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
def tokenizer(out: str, overrides: tuple[str, ...]) -> None:
    """Train the tokenizer of the data config (data.tokenizer.kind: wordpiece, bpe, byte-bpe, unigram)."""
    from cramlm.data.prepare import make_tokenizer

    cfg = resolve_or_exit("data", overrides)
    _writable(out, [path for _, path in cfg.data.local_paths()])
    start = time.perf_counter()
    tok = run_or_exit(make_tokenizer, cfg.data)
    run_or_exit(tok.save, out)
    _echo({"tokenizer": out, "kind": cfg.data.tokenizer.kind, "vocab_size": tok.get_vocab_size(),
           "seconds": round(time.perf_counter() - start, 2)})


@data_command.command("index")
@click.argument("jsonl", type=click.Path(exists=True, dir_okay=False))
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Default: <jsonl>.idx.npy")
def index(jsonl: str, out: str | None) -> None:
    """Build the raw (byte offset, length) index of a JSONL file (numpy .npy, no pickle)."""
    from cramlm.data.index import build_index, load_index

    start = time.perf_counter()
    path = run_or_exit(build_index, jsonl, out and _writable(out, [jsonl]))
    seconds = time.perf_counter() - start
    size = Path(jsonl).stat().st_size
    _echo({"index": str(path), "lines": len(load_index(path)), "mb": round(size / 1e6, 2),
           "mb_per_s": round(size / 1e6 / max(seconds, 1e-9), 1)})


@data_command.command("dedup", context_settings=OVERRIDES)
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Write the kept documents as JSONL.")
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
def dedup(out: str | None, overrides: tuple[str, ...]) -> None:
    """Count (and optionally drop) exact and near duplicates among the configured sources.

    Uses data.dedup (exact hashing is on even if not configured; near: data.dedup.near=true).
    """
    from cramlm.data.commands import dedup_sources

    cfg = resolve_or_exit("data", overrides)
    _echo(run_or_exit(dedup_sources, cfg.data, out and _writable(out, [path for _, path in cfg.data.local_paths()])))


@data_command.command("pack")
@click.argument("inputs", nargs=-1, required=True)
@click.option("--tokenizer", "tokenizer_path", required=True, help="tokenizer.json or an HF tokenizer folder.")
@click.option("--out", type=click.Path(dir_okay=False), required=True, help="The .cramtok file to write.")
@click.option("--text-key", default="text", help="Dotted key path of the text in each JSON record.")
@click.option("--on-error", type=click.Choice(["raise", "skip"]), default="raise")
def pack(inputs: tuple[str, ...], tokenizer_path: str, out: str, text_key: str, on_error: str) -> None:
    """Pack JSONL(.gz/.zst) / text / parquet files into one .cramtok (+ <out>.manifest.json)."""
    from cramlm.data.commands import pack_files

    _echo(run_or_exit(pack_files, list(inputs), tokenizer_path, _writable(out, [*inputs, tokenizer_path]), text_key, on_error))


@data_command.command("inspect")
@click.argument("path", type=click.Path(exists=True))
@click.option("--tokenizer", "tokenizer_path", default=None, help="To decode samples (default: the folder's).")
@click.option("--samples", type=click.IntRange(min=0), default=2)
@click.option("--chars", type=click.IntRange(min=0), default=300, help="Characters shown per decoded sample.")
def inspect(path: str, tokenizer_path: str | None, samples: int, chars: int) -> None:
    """Stats (documents, tokens, lengths, checksum) and decoded samples of a .cramtok or prepared folder."""
    from cramlm.data.commands import inspect_packed

    _echo(run_or_exit(inspect_packed, path, tokenizer_path, samples, chars))


@data_command.command("convert-modalities")
@click.argument("pbin", type=click.Path(exists=True, dir_okay=False))
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--vocab-size", type=click.IntRange(min=1), default=None, help="Default: the tokenizer's, else largest id + 1.")
@click.option("--tokenizer", "tokenizer_path", default=None, help="Records its fingerprint and vocab size.")
def convert_modalities(pbin: str, out: str, vocab_size: int | None, tokenizer_path: str | None) -> None:
    """Convert a Modalities .pbin to .cramtok (its pickled index is read without executing code)."""
    from cramlm.data.modalities import convert_pbin
    from cramlm.data.cramtok import read_packed

    _writable(out, [pbin, *([tokenizer_path] if tokenizer_path else [])])
    fp = b"\0" * 16
    if tokenizer_path:
        from cramlm.data.tokenizer import fingerprint, load_tokenizer

        tok = run_or_exit(load_tokenizer, tokenizer_path, False)
        fp, vocab_size = fingerprint(tok), vocab_size or tok.get_vocab_size()
    packed = run_or_exit(read_packed, run_or_exit(convert_pbin, pbin, out, vocab_size, fp))
    _echo({"out": out, "documents": packed.num_documents, "tokens": packed.num_tokens, "vocab_size": packed.vocab_size})
