"""A llama whose DDP state does not fit a small device, end to end under FSDP2 (issue 23.4):
`cramlm pretrain impl.distributed=fsdp` at 4 processes (real torchrun, gloo, the CPU) trains three
steps with checkpoints; its step-2 checkpoint alone (as a kill after step 2 leaves it) is resumed
in a run folder of its own with ``resume=auto``, whose step 3 must equal the uninterrupted run's;
and `cramlm export hf` writes the resumed run as a stock
``LlamaForCausalLM`` whose logits match cramlm's model. Beside it, the same model and batch in one
process (DDP's memory: every process holds all of it).

Per process it reports the peak resident memory (VmHWM) of the training launch, and the bytes of
state each process holds under each layout (16 B x parameters / processes: fp32 weights,
gradients, AdamW's two moments; measured exactly so by benchmarks/fsdp_memory.py). With the full
checkpoint format (``--format full``, the default here: the committed results) rank 0's peak
includes the checkpoint: the full state gathered into host memory (``full_state_dict`` with
``cpu_offload``), which on a GPU node is host RAM, not device memory; the other ranks' peaks are
what a device would have to hold (plus activations). ``--format sharded`` (FSDP2's default in
cramlm): every process writes its own shards (train/sharded.py), none gathers. Either way the
seconds spent writing checkpoints (``checkpoint_seconds`` of each launch's summary) are reported.

    python benchmarks/fsdp_end_to_end.py                        # hidden 1024 x 12 layers, ~199M parameters
    python benchmarks/fsdp_end_to_end.py --hidden 512 --layers 4 --out /tmp/e2e.json
    python benchmarks/fsdp_end_to_end.py --format sharded --out /tmp/e2e-sharded.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import shutil
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"


def peak_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def worker(argv: list[str], result: str) -> None:
    """One process of a launch: `cramlm pretrain ARGV`, then its peak RSS to RESULT.rank<r>.json."""
    from cramlm.cli import main

    try:
        main.main(["pretrain", *argv], standalone_mode=False)
    finally:
        rank = os.environ.get("RANK", "0")
        Path(f"{result}.rank{rank}.json").write_text(json.dumps({"rank": int(rank), "peak_rss": peak_rss()}))


def launch(procs: int, args: list[str], result: Path) -> list[dict]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={procs}", f"--master_port={port}",
           "--master_addr=127.0.0.1", str(Path(__file__).resolve()), "--worker", str(result), "--", *args]
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return [json.loads(Path(f"{result}.rank{r}.json").read_text()) for r in range(procs)]


def train_losses(run: Path) -> dict[int, float]:
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {m["step"]: m["loss"] for m in lines if m.get("kind") == "train"}


def export_matches(run: Path, out: Path) -> dict:
    """`cramlm export hf` of the run; transformers loads it offline; logits against cramlm's model."""
    import torch
    from transformers import AutoModelForCausalLM

    from cramlm.runs import load_run

    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "cramlm", "export", "hf", str(run), str(out)], env=env,
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        raise SystemExit(f"export failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    model, tok, _ = load_run(run)
    hf = AutoModelForCausalLM.from_pretrained(out)
    ids = torch.randint(4, tok.get_vocab_size(), (2, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model.eval()(input_ids=ids)["logits"].float()
        theirs = hf.eval()(input_ids=ids).logits.float()
    return {"class": type(hf).__name__, "max_abs_logit_diff": float((ours - theirs).abs().max()),
            "logit_scale": float(theirs.abs().max())}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--format", choices=["full", "sharded"], default="full", help="impl.checkpoint_format of the FSDP2 runs")
    ap.add_argument("--out", help="write the result (JSON) here, and a table beside it (.md)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args.rest, args.worker)
    heads = args.hidden // 64
    arch = [f"arch.hidden_size={args.hidden}", f"arch.num_layers={args.layers}", f"arch.num_heads={heads}",
            f"arch.num_kv_heads={max(1, heads // 4)}", f"arch.intermediate_size={4 * args.hidden}"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        common = ["arch=llama-small", *arch, f"base_dir={tmp}", f"impl.data_cache={tmp / 'data'}", "impl.progress=false",
                  "impl.precision=fp32", "budget=null", "impl.microbatch_size=1", "train.batch_size=4", "train.min_updates=0",
                  "train.validate_sequences=0", "train.log_every=1", "train.checkpoint_every=2", "train.optim.lr=1e-4"]
        one = launch(1, [*common, "name=one", "train.budget.steps=3"], tmp / "one")  # prepares the data too
        reference = train_losses(tmp / "one")
        fsdp = [*common, "impl.distributed=fsdp", f"impl.checkpoint_format={args.format}", "train.budget.steps=3",
                "train.keep_checkpoints=5"]
        first = launch(args.procs, [*fsdp, "name=fsdp"], tmp / "first")
        straight = train_losses(tmp / "fsdp")
        # killed after step 2: its step-2 checkpoint in a run folder of its own, resumed there
        shutil.copytree(tmp / "fsdp" / "checkpoints" / "step-00000002", tmp / "resumed" / "checkpoints" / "step-00000002")
        resumed = launch(args.procs, [*fsdp, "name=resumed", "resume=auto"], tmp / "resumed")
        run = tmp / "resumed"
        summary = json.loads((run / "summary.json").read_text())
        events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"resumed"' in line]
        losses = train_losses(run)
        seconds = {name: json.loads((tmp / name / "summary.json").read_text())["checkpoint_seconds"]
                   for name in ("fsdp", "resumed")}
        export = export_matches(run, tmp / "hf")
    params = summary["parameters"]
    result = {
        "benchmark": "fsdp_end_to_end", "command": " ".join(["python", "benchmarks/fsdp_end_to_end.py", *(argv or sys.argv[1:])]),
        "parameters": params, "processes": args.procs, "checkpoint_format": args.format,
        "checkpoint_seconds": {"fsdp_first": seconds["fsdp"], "fsdp_resumed": seconds["resumed"]},
        "state_bytes_per_process": {"ddp": 16 * params, "fsdp": 16 * params / args.procs},
        "peak_rss": {"fsdp_first": [r["peak_rss"] for r in first], "fsdp_resumed": [r["peak_rss"] for r in resumed],
                     "one_process": [r["peak_rss"] for r in one]},
        "losses": {"fsdp": losses, "fsdp_uninterrupted": straight, "one_process": reference}, "resumed_event": events[0] if events else None,
        "export": export,
    }
    gb = lambda b: f"{b / 1e9:.2f}"  # noqa: E731
    lines = [f"llama {args.hidden}x{args.layers}, {params / 1e6:.1f}M parameters; state per process: DDP "
             f"{gb(16 * params)} GB, FSDP2 at {args.procs} {gb(16 * params / args.procs)} GB; checkpoints {args.format}: "
             f"{seconds['fsdp']:.2f} s writing 2 (steps 2, 3), {seconds['resumed']:.2f} s writing 1 after the resume",
             "", "| launch | peak RSS rank 0 GB | peak RSS other ranks GB (max) |", "|---|---:|---:|"]
    for name, rows in (("FSDP2, steps 1-3, checkpoints", first), ("FSDP2 resumed at step 2, step 3", resumed), ("one process, steps 1-3", one)):
        others = [r["peak_rss"] for r in rows[1:]]
        lines.append(f"| {name} | {gb(rows[0]['peak_rss'])} | {gb(max(others)) if others else '-'} |")
    lines += ["", f"| step | FSDP2 resumed at step 2 ({args.procs} processes) | FSDP2 uninterrupted | one process |",
              "|---:|---:|---:|---:|"]
    cell = lambda d, s: f"{d[s]:.6f}" if s in d else "-"  # noqa: E731
    lines += [f"| {s} | {cell(losses, s)} | {cell(straight, s)} | {cell(reference, s)} |" for s in sorted(reference)]
    lines += ["", f"export: {export['class']}, max |logit difference| {export['max_abs_logit_diff']:.2e} "
                  f"(logits up to {export['logit_scale']:.1f})"]
    print(json.dumps(result, indent=1))
    print("\n".join(lines))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        Path(args.out).with_suffix(".md").write_text("\n".join(lines) + "\n")
    return result


if __name__ == "__main__":
    main()
