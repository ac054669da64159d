"""A llama whose DDP state does not fit a small device, end to end under FSDP2 with real torchrun
(gloo, the CPU). Three scenarios:

- default: `cramlm pretrain impl.distributed=fsdp` at 4 processes trains three steps with
  checkpoints; its step-2 checkpoint alone (as a kill after step 2 leaves it) is resumed in a run
  folder of its own with ``resume=auto``, whose step 3 must equal the uninterrupted run's; `cramlm
  export hf` writes the resumed run as a stock ``LlamaForCausalLM`` whose logits match cramlm's
  model. Beside it, the same model and batch in one process (DDP's memory). ``--format full`` (the
  default here: the committed fsdp_end_to_end results): rank 0's peak includes the full state
  gathered into its host memory; ``--format sharded``: every process writes its own shards.
- ``--resume-procs M`` (the crash): FSDP2 on --procs with a sharded checkpoint at step c
  (--checkpoint-step), killed with SIGKILL (every process) once step c+1 is logged, resumed with
  ``resume=auto`` on M processes (DCP resharding) through step c+2; `cramlm export hf` of the final
  sharded checkpoint (assembled from its shards), loaded by transformers, logits against cramlm's
  own forward. Each phase runs under a monitor that samples every process's peak RSS (VmHWM), the total resident at one moment
  and the memory available, and kills the phase when less than --floor-gib is left.
- ``--io-repeats R``: checkpoint write, verify and read seconds of the full and the sharded format
  (timed inside each process around the trainer's save_checkpoint, resume and find_resume), one
  launch of 3 checkpointed steps and R resumes per format.

Per process the peak resident memory; the state each holds is 16 B x parameters / processes with
AdamW (fp32 weights, gradients, two moments; benchmarks/fsdp_memory.py measures it exactly).

    python benchmarks/fsdp_end_to_end.py                        # hidden 1024 x 12 layers, 123.8M parameters
    python benchmarks/fsdp_end_to_end.py --hidden 512 --layers 4 --out /tmp/e2e.json
    python benchmarks/fsdp_end_to_end.py --format sharded --out /tmp/e2e-sharded.json
    python benchmarks/fsdp_end_to_end.py --io-repeats 3 --procs 2 --out benchmarks/results/checkpoint_io.json
    # the 1B's width and blocks at half its depth (520.1M), plain SGD; --layers 16 (1.0B) needs ~17 GB free
    python benchmarks/fsdp_end_to_end.py --hidden 2048 --layers 8 --intermediate 16384 --seq 64 --optim sgd \
        --momentum 0 --set train.optim.weight_decay=0 --procs 4 --resume-procs 2 --checkpoint-step 1 \
        --out benchmarks/results/fsdp_crash_reshard.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from cramlm.io import write_result

FLOOR = 1.5 * 2**30  # a phase is killed when the machine has less memory available than this


def peak_rss() -> int:
    """This process's peak resident memory (VmHWM), bytes; with the peaks before each
    ``reset_peak``."""
    return max(_FOLDED[0], status_bytes("VmHWM"))


def status_bytes(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


_FOLDED = [0]  # the peak before the last reset_peak


def reset_peak() -> None:
    """Start VmHWM again from the present resident size (Linux: clear_refs 5), keeping the peak so
    far for ``peak_rss``: what follows has a peak of its own."""
    _FOLDED[0] = peak_rss()
    Path("/proc/self/clear_refs").write_text("5")


def worker(argv: list[str], result: str) -> None:
    """One process of a launch: `cramlm pretrain ARGV`, then its peak RSS and each checkpoint call's
    seconds and peak (``timed_calls``) to RESULT.rank<r>.json."""
    from cramlm.cli import main

    calls = timed_calls()
    try:
        main.main(["pretrain", *argv], standalone_mode=False)
    finally:
        rank = os.environ.get("RANK", "0")
        Path(f"{result}.rank{rank}.json").write_text(json.dumps({"rank": int(rank), "peak_rss": peak_rss(), "calls": calls}))


def timed_calls() -> list[dict]:
    """Times, in this process, each call of the trainer's checkpoint write (``save_checkpoint``:
    state dicts, files, digests, the closing barrier), of its resume (``resume``: reading and loading
    weights, optimizer and data state) and of the checkpoint's verification before it (rank 0's
    ``find_resume``: every file against its digest), with the resident memory before the call and
    its peak during it; the list they are appended to."""
    from cramlm.train import checkpoint
    from cramlm.train.trainer import Trainer

    calls: list[dict] = []

    def timed(owner, name: str, label: str) -> None:
        fn = getattr(owner, name)

        def wrapper(*a, **k):
            rss = status_bytes("VmRSS")
            reset_peak()
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                calls.append({"call": label, "seconds": round(time.perf_counter() - t0, 4), "rss_before": rss,
                              "peak_rss": status_bytes("VmHWM")})

        setattr(owner, name, wrapper)

    timed(Trainer, "save_checkpoint", "write")
    timed(Trainer, "resume", "read")
    timed(checkpoint, "find_resume", "verify")
    return calls


class Monitor(threading.Thread):
    """Samples a launch's processes (the root and its descendants) every ``every`` seconds: each
    one's VmHWM (peak resident memory; monotonic, so the last sample is its peak so far), keyed by
    its RANK (``main`` without one), the peak of the sum of the ranks' VmRSS (the total resident at
    one moment), and the machine's MemAvailable. Below ``floor`` bytes available it kills the launch
    (its process group) and says so: a phase never takes the machine out of memory."""

    def __init__(self, root: int, floor: float, every: float = 0.5):
        super().__init__(daemon=True)
        self.root, self.floor, self.every = root, floor, every
        self.peaks: dict[str, int] = {}
        self.seen: set[int] = set()
        self.total_peak, self.min_available, self.aborted = 0, None, False
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.sample()
            self.done.wait(self.every)

    def sample(self) -> None:
        total = 0
        for pid in descendants(self.root):
            self.seen.add(pid)
            status, rank = proc_status(pid), proc_rank(pid)
            if status is None:
                continue
            self.peaks[rank] = max(self.peaks.get(rank, 0), status.get("VmHWM", 0))
            total += status.get("VmRSS", 0) if rank != "main" else 0
        self.total_peak = max(self.total_peak, total)
        available = mem_available()
        self.min_available = available if self.min_available is None else min(self.min_available, available)
        if available < self.floor and not self.aborted:
            self.aborted = True
            print(f"Error: {available / 2**30:.2f} GiB available, under {self.floor / 2**30:.2f} GiB: killing the launch")
            kill_all(self.root)

    def stop(self) -> dict:
        self.done.set()
        self.join()
        ranks = sorted((k for k in self.peaks if k != "main"), key=int)
        return {"peak_rss_per_rank": [self.peaks[k] for k in ranks], "peak_rss_sum_of_ranks": sum(self.peaks[k] for k in ranks),
                "peak_rss_total": self.total_peak, "peak_rss_main": self.peaks.get("main"),
                "min_available": self.min_available, "aborted_low_memory": self.aborted}


def descendants(root: int) -> list[int]:
    """``root`` and every process below it (from /proc's parent links)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def kill_all(root: int) -> None:
    """SIGKILL ``root`` and every process below it (torchrun's workers run in sessions of their own:
    a signal to its process group would leave them running), and wait until they are gone."""
    pids = descendants(root)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    while any(Path(f"/proc/{pid}").exists() and proc_state(pid) != "Z" for pid in pids[1:]):
        time.sleep(0.1)


def proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "X"


def proc_cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def proc_status(pid: int) -> dict[str, int] | None:
    """VmHWM and VmRSS of a process, bytes (None once it is gone)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return None
    return {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in lines) if k in ("VmHWM", "VmRSS")}


def proc_rank(pid: int) -> str:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return "main"
    ranks = [e[5:].decode() for e in env if e.startswith(b"RANK=")]
    return ranks[0] if ranks else "main"


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def monitored(cmd: list[str], env: dict, floor: float, kill_when=None, kill_delay: float = 0.0,
              timeout: float = 7200) -> tuple[dict, subprocess.CompletedProcess]:
    """Run ``cmd`` in a process group of its own under a Monitor; ``kill_when()`` true: SIGKILL the
    group ``kill_delay`` seconds later (a crash mid-run). (the Monitor's figures, the finished process)"""
    t0 = time.monotonic()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, text=True, start_new_session=True,
                                preexec_fn=first_to_go)
        monitor = Monitor(proc.pid, floor)
        monitor.start()
        kill_at, killed = None, False
        while proc.poll() is None and time.monotonic() - t0 < timeout:
            if kill_when is not None and kill_at is None and kill_when():
                kill_at = time.monotonic() + kill_delay
            if kill_at is not None and time.monotonic() >= kill_at:
                kill_all(proc.pid)  # kill -9 of torchrun and every rank
                killed = True
                break
            time.sleep(0.2)
        if proc.poll() is None and not killed:
            kill_all(proc.pid)  # past the timeout
        proc.wait()
        for pid in monitor.seen - {proc.pid}:  # a rank its torchrun left behind when it failed
            if proc_state(pid) not in ("X", "Z") and Path(__file__).name.encode() in proc_cmdline(pid):
                os.kill(pid, signal.SIGKILL)
        figures = {**monitor.stop(), "seconds": round(time.monotonic() - t0, 1), "killed": killed}
        out.seek(0), err.seek(0)
        return figures, subprocess.CompletedProcess(cmd, proc.returncode, out.read(), err.read())


def first_to_go() -> None:
    """Should the machine run out of memory after all, the kernel kills this process (and what it
    starts) before anyone else's: oom_score_adj 1000."""
    Path("/proc/self/oom_score_adj").write_text("1000")


def torchrun(procs: int, args: list[str], result: Path) -> list[str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={procs}", f"--master_port={port}",
            "--master_addr=127.0.0.1", str(Path(__file__).resolve()), "--worker", str(result), "--", *args]


def child_env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")


def launch(procs: int, args: list[str], result: Path, floor: float = FLOOR, **kill) -> tuple[list[dict], dict]:
    """One torchrun of `cramlm pretrain ARGS` under a Monitor: (each rank's own report, the Monitor's
    figures). Killed on purpose (``kill``): the ranks report nothing, the Monitor's peaks stand."""
    cmd = torchrun(procs, args, result)
    figures, proc = monitored(cmd, child_env(), floor, **kill)
    if figures["aborted_low_memory"]:
        raise SystemExit(f"aborted: under {floor / 2**30:.1f} GiB available ({json.dumps(figures)})\n{proc.stderr[-3000:]}")
    if proc.returncode and not figures["killed"]:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    reports = [Path(f"{result}.rank{r}.json") for r in range(procs)]
    return [json.loads(p.read_text()) for p in reports if p.is_file()], figures


def train_losses(run: Path, segment: int | None = None) -> dict[int, float]:
    """{step: loss} of a run's train lines; ``segment`` k: only those after its k-th ``resumed`` event
    (0: before the first), else the last logged of each step."""
    path = run / "metrics.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    seen, losses = 0, {}
    for m in lines:
        seen += m.get("event") == "resumed"
        if m.get("kind") == "train" and (segment is None or seen == segment):
            losses[m["step"]] = m["loss"]
    return losses


def export(source: Path, out: Path, floor: float = FLOOR) -> dict:
    """`cramlm export hf SOURCE OUT` (a run, or a checkpoint folder: a sharded one is assembled from
    its shards) under a Monitor: its figures."""
    cmd = [sys.executable, "-m", "cramlm", "export", "hf", str(source), str(out)]
    figures, proc = monitored(cmd, child_env(), floor, timeout=3600)
    if proc.returncode:
        raise SystemExit(f"export failed ({proc.returncode}, {json.dumps(figures)}):\n{proc.stdout}\n{proc.stderr}")
    return figures


def compare_logits(run: Path, hf_dir: Path, seq: int = 64) -> dict:
    """Logits of cramlm's model of RUN against transformers' load of HF_DIR, on the same random ids;
    one model in memory at a time."""
    import gc

    import torch
    from transformers import AutoModelForCausalLM

    from cramlm.run.build import load_run

    model, tok, _ = load_run(run)
    ids = torch.randint(4, tok.get_vocab_size(), (2, seq), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model.eval()(input_ids=ids)["logits"].float()
    del model
    gc.collect()
    hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    with torch.no_grad():
        theirs = hf.eval()(input_ids=ids).logits.float()
    return {"class": type(hf).__name__, "max_abs_logit_diff": float((ours - theirs).abs().max()),
            "logit_scale": float(theirs.abs().max()), "ids": list(ids.shape)}


def compare_monitored(run: Path, hf_dir: Path, floor: float = FLOOR) -> dict:
    """``compare_logits`` in a process of its own under a Monitor (its peak memory is the two
    models' one at a time): its result with the figures."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--compare", str(run), str(hf_dir)]
    figures, proc = monitored(cmd, child_env(), floor, timeout=3600)
    if proc.returncode:
        raise SystemExit(f"logit comparison failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "figures": figures}


def checkpoint_bytes(folder: Path) -> dict:
    """Bytes of each file of a checkpoint folder, and of each rank's shards (``__<rank>_0.distcp``)."""
    files = {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()}
    ranks = {int(n[2:].split("_")[0]): b for n, b in files.items() if n.endswith(".distcp")}
    return {"files": files, "total": sum(files.values()), "per_rank": [ranks[r] for r in sorted(ranks)]}


def calls(reports: list[dict], kind: str, key: str = "seconds") -> list[float]:
    """``key`` of each ``kind`` call (write, read, verify), the slowest rank's for each."""
    per_rank = [times for r in reports if (times := [c[key] for c in r["calls"] if c["call"] == kind])]
    return [max(times) for times in zip(*per_rank)] if per_rank else []  # (verify: rank 0 alone)


def call_peaks(reports: list[dict]) -> dict:
    """Per call kind and rank, the call that raised its resident memory most: resident before it,
    peak during it, and the difference (``growth``)."""
    out = {}
    for kind in ("verify", "read", "write"):
        rows = [[c for c in r["calls"] if c["call"] == kind and c["seconds"] > 0] for r in reports]
        most = [max(row, key=lambda c: c["peak_rss"] - c["rss_before"]) if row else None for row in rows]
        out[kind] = [{"rss_before": c["rss_before"], "peak_rss": c["peak_rss"], "growth": c["peak_rss"] - c["rss_before"]}
                     if c else None for c in most]
    return out


def parse(argv: list[str] | None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--intermediate", type=int, help="arch.intermediate_size (gate + up); default 4 x hidden")
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--format", choices=["full", "sharded"], default="full", help="impl.checkpoint_format of the FSDP2 runs")
    ap.add_argument("--resume-procs", type=int, help="the crash scenario: train on --procs, kill -9 after a "
                    "checkpoint, resume on this many processes, export the final sharded checkpoint")
    ap.add_argument("--checkpoint-step", type=int, default=2, help="the crash: its checkpoint's step (killed one step later)")
    ap.add_argument("--io-repeats", type=int, help="checkpoint write/read seconds of both formats, N resumes each")
    ap.add_argument("--optim", default="adamw", help="train.optim.type (the crash scenario: sgd when AdamW's state cannot fit)")
    ap.add_argument("--momentum", type=float, help="train.optim.momentum (sgd)")
    ap.add_argument("--seq", type=int, help="data.seq_length (default: the data recipe's)")
    ap.add_argument("--data", default="default", help="data recipe; the 1.1B: shared-corpus with --vocab 32768")
    ap.add_argument("--vocab", type=int, help="data.tokenizer.vocab_size")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="more `cramlm pretrain` overrides")
    ap.add_argument("--work", help="keep runs and data here (default: a temporary folder); a prepared data cache is reused")
    ap.add_argument("--floor-gib", type=float, default=FLOOR / 2**30, help="kill a phase when less memory is available")
    ap.add_argument("--out", help="write the result (JSON) here, and a table beside it (.md)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--compare", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def common_args(args, tmp: Path) -> list[str]:
    heads = args.hidden // 64
    arch = [f"arch.hidden_size={args.hidden}", f"arch.num_layers={args.layers}", f"arch.num_heads={heads}",
            f"arch.num_kv_heads={max(1, heads // 4)}", f"arch.intermediate_size={args.intermediate or 4 * args.hidden}"]
    data = [f"data={args.data}"] + [f"data.seq_length={args.seq}"] * bool(args.seq) + \
        [f"data.tokenizer.vocab_size={args.vocab}"] * bool(args.vocab)
    optim = [f"train.optim.type={args.optim}"] + [f"train.optim.momentum={args.momentum}"] * (args.momentum is not None)
    return ["arch=llama-small", *arch, *data, f"base_dir={tmp}", f"impl.data_cache={tmp / 'data'}", "impl.progress=false",
            "impl.precision=fp32", "budget=null", "impl.microbatch_size=1", "train.batch_size=4", "train.min_updates=0",
            "train.validate_sequences=0", "train.log_every=1", *optim, "train.optim.lr=1e-4", *args.set]


def main(argv: list[str] | None = None) -> dict | None:
    args = parse(argv)
    if args.worker:
        return worker(args.rest, args.worker)
    if args.compare:
        print(json.dumps(compare_logits(Path(args.compare[0]), Path(args.compare[1]))))
        return None
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(args.work or scratch)
        tmp.mkdir(parents=True, exist_ok=True)
        common = common_args(args, tmp)
        scenario = crash_and_reshard if args.resume_procs else io_seconds if args.io_repeats else lone_checkpoint
        result, lines = scenario(args, common, tmp)
    result = {"benchmark": "fsdp_end_to_end",
              "command": " ".join(["python", "benchmarks/fsdp_end_to_end.py", *(argv or sys.argv[1:])]),
              "machine": machine(), **result}
    lines = [f"{result['machine']}; `{result['command']}`", "", *lines]
    print(json.dumps(result, indent=1))
    print("\n".join(lines))
    if args.out:
        write_result(args.out, result, "\n".join(lines))
    return result


def machine() -> str:
    import platform

    import torch

    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.machine())
    return (f"{os.cpu_count()} cores ({model}), {os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / 2**30:.0f} GiB, "
            f"torch {torch.__version__}, {time.strftime('%Y-%m-%d')}, load average {os.getloadavg()[0]:.1f} at the end")


def gb(b: float | None) -> str:
    return "-" if b is None else f"{b / 1e9:.2f}"


def lone_checkpoint(args, common: list[str], tmp: Path) -> tuple[dict, list[str]]:
    """3 steps in one process and under FSDP2 with checkpoints; the FSDP2 run's step-2 checkpoint alone
    resumed on as many processes; its export's logits against cramlm's."""
    one, _ = launch(1, [*common, "name=one", "train.budget.steps=3", "train.checkpoint_every=2"], tmp / "one")
    reference = train_losses(tmp / "one")
    fsdp = [*common, "impl.distributed=fsdp", f"impl.checkpoint_format={args.format}", "train.budget.steps=3",
            "train.keep_checkpoints=5", "train.checkpoint_every=2"]
    first, _ = launch(args.procs, [*fsdp, "name=fsdp"], tmp / "first")
    straight = train_losses(tmp / "fsdp")
    # killed after step 2: its step-2 checkpoint in a run folder of its own, resumed there
    shutil.copytree(tmp / "fsdp" / "checkpoints" / "step-00000002", tmp / "resumed" / "checkpoints" / "step-00000002")
    resumed, _ = launch(args.procs, [*fsdp, "name=resumed", "resume=auto"], tmp / "resumed")
    run = tmp / "resumed"
    summary = json.loads((run / "summary.json").read_text())
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"resumed"' in line]
    losses = train_losses(run)
    seconds = {name: json.loads((tmp / name / "summary.json").read_text())["checkpoint_seconds"] for name in ("fsdp", "resumed")}
    export(run, tmp / "hf")
    exported = compare_logits(run, tmp / "hf")
    params = summary["parameters"]
    result = {
        "parameters": params, "processes": args.procs, "checkpoint_format": args.format,
        "checkpoint_seconds": {"fsdp_first": seconds["fsdp"], "fsdp_resumed": seconds["resumed"]},
        "state_bytes_per_process": {"ddp": 16 * params, "fsdp": 16 * params / args.procs},
        "peak_rss": {"fsdp_first": [r["peak_rss"] for r in first], "fsdp_resumed": [r["peak_rss"] for r in resumed],
                     "one_process": [r["peak_rss"] for r in one]},
        "losses": {"fsdp": losses, "fsdp_uninterrupted": straight, "one_process": reference},
        "resumed_event": events[0] if events else None, "export": exported,
    }
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
    lines += ["", f"export: {exported['class']}, max |logit difference| {exported['max_abs_logit_diff']:.2e} "
                  f"(logits up to {exported['logit_scale']:.1f})"]
    return result, lines


STATE_BYTES = {"adamw": 16, "adam": 16, "lion": 12, "sgd": 8}  # fp32 weights + gradients + the optimizer's moments


def crash_and_reshard(args, common: list[str], tmp: Path) -> tuple[dict, list[str]]:
    """FSDP2 on --procs with a sharded checkpoint at step c (--checkpoint-step), killed (SIGKILL to
    every process) once step c+1 is logged, resumed with ``resume=auto`` on --resume-procs from
    the step-c checkpoint through step c+2 (its step c+1 against the killed run's); `cramlm export
    hf` of the final sharded checkpoint; transformers' logits against cramlm's. Each phase under a
    Monitor (peak RSS per rank and in total)."""
    floor, c = args.floor_gib * 2**30, args.checkpoint_step
    fsdp = [*common, "impl.distributed=fsdp", "impl.checkpoint_format=sharded", f"train.budget.steps={c + 2}",
            f"train.checkpoint_every={c}", "train.keep_checkpoints=5", "name=crash"]
    run, name = tmp / "crash", lambda step: f"step-{step:08d}"  # noqa: E731
    _, first = launch(args.procs, fsdp, tmp / "first", floor, kill_when=lambda: c + 1 in train_losses(run))
    left = sorted(p.name for p in (run / "checkpoints").iterdir())
    if not first["killed"] or name(c + 2) in left:
        raise SystemExit(f"the first launch was not killed between its step-{c} and step-{c + 2} checkpoints ({left})")
    written = checkpoint_bytes(run / "checkpoints" / name(c))
    reports, resumed = launch(args.resume_procs, [*fsdp, "resume=auto"], tmp / "resumed", floor)
    summary = json.loads((run / "summary.json").read_text())
    killed, again = train_losses(run, 0), train_losses(run, 1)
    event = next(json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"resumed"' in line)
    exported = {"export": export(run / "checkpoints" / name(c + 2), tmp / "hf", floor)}  # assembled from the shards
    exported.update(compare_monitored(run, tmp / "hf", floor))
    params, per_param = summary["parameters"], STATE_BYTES.get(args.optim)
    if args.optim == "sgd" and (args.momentum is None or args.momentum > 0):
        per_param += 4  # the momentum buffer
    result = {
        "scenario": "crash_and_reshard", "parameters": params, "processes": args.procs, "resume_processes": args.resume_procs,
        "optimizer": {"type": args.optim, "momentum": args.momentum, "state_bytes_per_parameter": per_param},
        "sequence_length": args.seq, "batch": 4, "microbatch": 1, "checkpoint_format": "sharded", "checkpoint_step": c,
        "state_bytes_per_process": {str(n): per_param * params / n for n in (args.procs, args.resume_procs)} if per_param else None,
        "phases": {"train_killed": first, "resumed": resumed, "export": exported.pop("export"), "compare": exported.pop("figures")},
        "left_by_the_kill": left,
        "checkpoints": {name(c): written, name(c + 2): checkpoint_bytes(run / "checkpoints" / name(c + 2))},
        "seconds": {kind: calls(reports, kind) for kind in ("verify", "read", "write")},
        "checkpoint_call_memory": call_peaks(reports),
        "losses": {"killed_run": killed, "resumed": again}, "resumed_event": event, "export": exported,
        "resumed_step_loss_difference": abs(killed[c + 1] - again[c + 1]) if c + 1 in killed and c + 1 in again else None,
    }
    return result, crash_table(args, result)


def crash_table(args, r: dict) -> list[str]:
    params, opt, ph, c = r["parameters"], r["optimizer"], r["phases"], r["checkpoint_step"]
    state = r["state_bytes_per_process"] or {}
    lines = [f"llama {args.hidden}x{args.layers} (intermediate {args.intermediate or 4 * args.hidden}), {params / 1e6:.1f}M "
             f"parameters; optimizer {opt['type']}" + (f" (momentum {opt['momentum']})" if opt["momentum"] is not None else "")
             + f", state {opt['state_bytes_per_parameter']} B/parameter: {', '.join(f'{gb(b)} GB per process at {n}' for n, b in state.items())}; "
             f"sequence {r['sequence_length']}, batch 4 (microbatch 1), fp32, sharded checkpoints",
             "", "| phase | processes | peak RSS per rank GB | sum of rank peaks GB | peak total at once GB | least available GiB | s |",
             "|---|---:|---|---:|---:|---:|---:|"]
    rows = ((f"train, steps 1-{c + 1}, checkpoint at {c}, killed (SIGKILL) in step {c + 2}", args.procs, ph["train_killed"]),
            (f"resume=auto from step {c}, steps {c + 1}-{c + 2}, checkpoint + model.safetensors from shards", args.resume_procs, ph["resumed"]))
    for what, n, f in rows:
        lines.append(f"| {what} | {n} | {' / '.join(gb(b) for b in f['peak_rss_per_rank'])} | {gb(f['peak_rss_sum_of_ranks'])} | "
                     f"{gb(f['peak_rss_total'])} | {f['min_available'] / 2**30:.1f} | {f['seconds']:.0f} |")
    for what, f in ((f"`cramlm export hf` of the step-{c + 2} sharded checkpoint", ph["export"]),
                    ("logits: cramlm's model, then LlamaForCausalLM", ph["compare"])):
        lines.append(f"| {what} | 1 | {gb(f['peak_rss_main'])} | - | - | {f['min_available'] / 2**30:.1f} | {f['seconds']:.0f} |")
    lines += ["", "| checkpoint | written by | bytes per rank GB | all files GB |", "|---|---:|---|---:|"]
    for (what, b), n in zip(r["checkpoints"].items(), (args.procs, args.resume_procs)):
        lines.append(f"| {what} | {n} processes | {' / '.join(gb(x) for x in b['per_rank'])} | {gb(b['total'])} |")
    lines += ["", f"| resumed run ({args.resume_procs} processes): call | resident before, per rank GB | peak during it GB | growth GB |",
              "|---|---|---|---|"]
    for kind, rows in r["checkpoint_call_memory"].items():
        cells = [(gb(x["rss_before"]), gb(x["peak_rss"]), gb(x["growth"])) if x else ("-",) * 3 for x in rows]
        lines.append(f"| {kind} | " + " | ".join(" / ".join(c[i] for c in cells) for i in range(3)) + " |")
    killed, again = r["losses"]["killed_run"], r["losses"]["resumed"]
    lines += ["", f"| step | killed run ({args.procs} processes) | resumed ({args.resume_procs} processes) |", "|---:|---:|---:|"]
    cell = lambda d, s: f"{d[s]:.6f}" if s in d else "-"  # noqa: E731
    lines += [f"| {s} | {cell(killed, s)} | {cell(again, s)} |" for s in sorted({*killed, *again})]
    sec, ex = r["seconds"], r["export"]
    lines += ["", f"left by the kill: {', '.join(r['left_by_the_kill'])}; resume: verify {sec['verify']} s, read {sec['read']} s, "
                  f"writes {sec['write']} s; export: {ex['class']}, max |logit difference| {ex['max_abs_logit_diff']:.2e} "
                  f"(logits up to {ex['logit_scale']:.1f}, ids {ex['ids']})"]
    return lines


def io_seconds(args, common: list[str], tmp: Path) -> tuple[dict, list[str]]:
    """Checkpoint write and read seconds of both formats under FSDP2 on --procs: per format one launch
    of 3 steps writing a checkpoint at each (3 writes), then --io-repeats launches each resuming its
    step-2 checkpoint in a run folder of its own (verify, read, one write)."""
    rows = {}
    for fmt in ("full", "sharded"):
        fsdp = [*common, "impl.distributed=fsdp", f"impl.checkpoint_format={fmt}", "train.budget.steps=3",
                "train.checkpoint_every=1", "train.keep_checkpoints=5"]
        reports, first = launch(args.procs, [*fsdp, f"name={fmt}"], tmp / f"{fmt}-first", args.floor_gib * 2**30)
        writes, reads, verifies, peaks = calls(reports, "write"), [], [], [first["peak_rss_per_rank"]]
        memory = [call_peaks(reports)]
        step2 = tmp / fmt / "checkpoints" / "step-00000002"
        for i in range(args.io_repeats):
            shutil.copytree(step2, tmp / f"{fmt}-{i}" / "checkpoints" / step2.name)
            again, figures = launch(args.procs, [*fsdp, f"name={fmt}-{i}", "resume=auto"], tmp / f"{fmt}-{i}", args.floor_gib * 2**30)
            writes += calls(again, "write")
            reads += calls(again, "read")
            verifies += calls(again, "verify")
            peaks.append(figures["peak_rss_per_rank"])
            memory.append(call_peaks(again))
        rows[fmt] = {"write_seconds": writes, "read_seconds": reads, "verify_seconds": verifies,
                     "bytes": checkpoint_bytes(step2), "peak_rss_per_rank": peaks, "checkpoint_call_memory": memory}
    params = json.loads((tmp / "sharded" / "summary.json").read_text())["parameters"]
    result = {"scenario": "io_seconds", "parameters": params, "processes": args.procs, "formats": rows}
    return result, io_table(args, result)


def io_table(args, result: dict) -> list[str]:
    params, rows = result["parameters"], result["formats"]
    lines = [f"llama {args.hidden}x{args.layers}, {params / 1e6:.1f}M parameters, FSDP2 at {args.procs} processes, AdamW "
             "(12 B/parameter written); seconds: the slowest rank's, median [min-max] of each call", "",
             "| format | write s (n) | verify s (rank 0) | read s | verify + read s | checkpoint GB | largest file GB | "
             "write: rank 0 / others, growth over the resident GB | read: rank 0 / others, growth GB | peak RSS rank 0 / others GB |",
             "|---|---|---|---|---:|---:|---:|---|---|---|"]
    for fmt, row in rows.items():
        med = {k: statistics.median(row[k]) for k in ("write_seconds", "read_seconds", "verify_seconds")}
        span = lambda k: f"{med[k]:.2f} [{min(row[k]):.2f}-{max(row[k]):.2f}]"  # noqa: E731
        files = row["bytes"]["files"]
        lines.append(f"| {fmt} | {span('write_seconds')} ({len(row['write_seconds'])}) | {span('verify_seconds')} | "
                     f"{span('read_seconds')} | {med['verify_seconds'] + med['read_seconds']:.2f} | {gb(row['bytes']['total'])} | "
                     f"{gb(max(files.values()))} | {growth(row, 'write')} | {growth(row, 'read')} | "
                     f"{gb(max(p[0] for p in row['peak_rss_per_rank']))} / {gb(max(max(p[1:]) for p in row['peak_rss_per_rank']))} |")
    return lines


def growth(row: dict, kind: str) -> str:
    """The most a ``kind`` call raised rank 0's and the other ranks' resident memory (peak during it
    less resident before it), over every launch of a format."""
    def most(ranks) -> float:
        return max((x["growth"] for launch in row["checkpoint_call_memory"]
                    for i, x in enumerate(launch[kind]) if x and i in ranks), default=0)
    n = len(row["peak_rss_per_rank"][0])
    return f"{gb(most({0}))} / {gb(most(set(range(1, n))))}"


if __name__ == "__main__":
    main()
