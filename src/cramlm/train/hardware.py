"""What this machine is good at: the ``impl.precision=auto`` probe and ``impl.threads=auto``.

Precision. CPUs differ: on one with AVX512-BF16 (AMD EPYC Zen 4) bf16 matrix products run at twice
the fp32 rate, on another bf16 ran at a fifth of it. So ``auto`` measures instead of assuming: the
forward and backward of an MLP with the model's widths (hidden -> intermediate -> hidden), fp32
against bf16 autocast, interleaved and best-of, in well under a second; bf16 wins when it is at
least ``BF16_MIN_SPEEDUP`` times faster, timed on one core in CPU time (so other work on a shared
machine does not decide). The answer is cached per machine in ``$CRAMLM_CACHE/hardware.json``
(default ``~/.cache/cramlm``), keyed by CPU (model name, x86 family and model, bf16 instructions), torch version, device and the shapes. On a CUDA
GPU with bf16 support the answer is bf16, unmeasured.

Threads. ``auto`` takes the CPUs this process may run on (its affinity mask) capped by the cgroup
CPU quota (``cpu.max`` in cgroup v2, ``cpu.cfs_quota_us`` in v1; containers), divided among the
processes torchrun started on this node, so that they never ask for more cores than they have. A
single process also leaves out the CPUs that other work keeps busy (measured from /proc/stat over a
quarter of a second): torch's threads wait for each other at every operation, so one thread whose
core is taken by a neighbour stalls them all. Measured on a 2-core VM with other jobs running (load
6-8): 2 threads 1,367-1,719 tokens/s, 1 thread 3,604-4,706, torchrun with 2 processes of 1 thread
5,211-5,643 (crammed-bert-tiny, batch 64, 25 s runs).
"""

from __future__ import annotations

import functools
import json
import math
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

BF16_MIN_SPEEDUP = 1.1  # bf16 rounds more than fp32: take it only when it clearly pays
PROBE_SECONDS = 0.4  # the timed part of the precision probe, both precisions together
CACHE_VERSION = 2
PRECISION_DTYPES: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}  # None: no autocast


# ---- threads ----------------------------------------------------------------------------------


def cgroup_cpu_limit(root: str | Path = "/sys/fs/cgroup") -> float | None:
    """CPUs the cgroup quota allows (e.g. 1.5), or None when unlimited or unknown."""
    root = Path(root)
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]  # cgroup v2: "max 100000" or "150000 100000"
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:  # cgroup v1
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 else quota / period
    except (OSError, ValueError):
        return None


def usable_cpus(affinity: set[int] | None = None, quota: float | None = None) -> int:
    """CPUs this process may use: its affinity mask, capped by the cgroup quota (rounded down,
    at least 1: a quota of 1.5 CPUs keeps one thread busy without throttling)."""
    if affinity is None:
        affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    n = len(affinity)
    if quota is not None:
        n = min(n, max(1, math.floor(quota)))
    return max(1, n)


def _cpu_times(stat: str) -> tuple[float, float, int]:
    """(busy, total, CPUs) in clock ticks from the text of /proc/stat (steal counts as busy: the
    hypervisor gave that time to another guest)."""
    lines = stat.splitlines()
    fields = [float(v) for v in lines[0].split()[1:]]
    fields += [0.0] * (8 - len(fields))
    idle = fields[3] + fields[4]  # idle + iowait
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
    cpus = sum(1 for line in lines[1:] if line.startswith("cpu") and line[3:4].isdigit())
    return total - idle, total, max(1, cpus)


def free_cpus(before: str, after: str, own_seconds: float, ticks_per_second: float = 100.0) -> float:
    """CPUs that other work left free between two readings of /proc/stat, this process's own CPU
    time in between (``own_seconds``) not counted as other work."""
    busy0, total0, cpus = _cpu_times(before)
    busy1, total1, _ = _cpu_times(after)
    elapsed = (total1 - total0) / cpus  # ticks per CPU
    if elapsed <= 0:
        return float(cpus)
    others = max(0.0, (busy1 - busy0) - own_seconds * ticks_per_second) / elapsed  # CPUs busy with other work
    return max(0.0, cpus - others)


def measure_free_cpus(seconds: float = 0.25) -> float | None:
    """CPUs not busy with other work right now (None where /proc/stat is unavailable)."""
    try:
        before, own = Path("/proc/stat").read_text(), time.process_time()
        time.sleep(seconds)
        after, own = Path("/proc/stat").read_text(), time.process_time() - own
        return free_cpus(before, after, own, os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def auto_threads(
    affinity: set[int] | None = None,
    quota: float | None = None,
    local_processes: int | None = None,
    free: float | None = None,
) -> int:
    """Threads per process: the usable CPUs shared among the processes on this node (torchrun's
    LOCAL_WORLD_SIZE); a single process takes no more than the CPUs other work leaves ``free``
    (rounded, at least 1)."""
    if quota is None and affinity is None:
        quota = cgroup_cpu_limit()
    if local_processes is None:
        local_processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    threads = max(1, usable_cpus(affinity, quota) // max(1, local_processes))
    if local_processes == 1 and free is not None:  # under torchrun the neighbours are our own ranks
        threads = max(1, min(threads, math.floor(free + 0.5)))
    return threads


def resume_threads(setting: int | str | None, written: dict, now: int, world: int, usable: int) -> int | None:
    """The thread count to switch to when resuming a checkpoint whose state.json is ``written``
    (None: keep ``now``). With impl.threads=auto a resumed run takes the count the checkpoint was
    written with (``threads``), where the same number of processes wrote it (``world_size``) and
    each process may use that many CPUs (``usable``: affinity and quota shared among the local
    processes): CPU kernels split their sums by thread, so the same count keeps a resumed run
    bitwise on the course of an uninterrupted one. A number in the config is the user's word and is kept."""
    count = written.get("threads")
    if setting != "auto" or not isinstance(count, int) or count < 1 or count == now or count > usable:
        return None
    if written.get("world_size", 1) != world:
        return None
    return count


def resolve_threads(setting: int | str | None) -> int | None:
    """impl.threads -> a thread count to set (None: leave torch's default)."""
    if setting == "auto":
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
        return auto_threads(local_processes=local, free=measure_free_cpus() if local == 1 else None)
    return setting or None


# ---- precision --------------------------------------------------------------------------------


@dataclass
class PrecisionChoice:
    precision: str  # fp32 | bf16 | fp16
    reason: str  # one line for the summary and the console
    speedup: float | None = None  # measured bf16 speedup over fp32 (fp32 seconds / bf16 seconds)
    source: str = "config"  # config | probe | cache | cuda

    @property
    def dtype(self) -> torch.dtype | None:  # the autocast dtype; None: plain fp32
        return PRECISION_DTYPES[self.precision]

    def as_dict(self) -> dict:
        return asdict(self)


def decide_precision(fp32_seconds: float, bf16_seconds: float, min_speedup: float = BF16_MIN_SPEEDUP) -> tuple[str, float]:
    """(precision, bf16 speedup) from the two timings of the same work."""
    speedup = fp32_seconds / bf16_seconds if bf16_seconds > 0 else 0.0
    return ("bf16" if speedup >= min_speedup else "fp32"), speedup


def probe_rows(hidden: int, intermediate: int, flops: float = 1e9) -> int:
    """Rows (tokens) per probe step so that one fp32 step on one core is about 10-30 ms."""
    per_row = 6 * 2 * hidden * intermediate  # forward + backward of two matmuls
    return int(min(8192, max(128, flops / per_row)) // 128 * 128)


def time_precisions(device: torch.device, hidden: int, intermediate: int, seconds: float = PROBE_SECONDS) -> tuple[float, float]:
    """Best-of seconds of one forward + backward of an MLP hidden -> intermediate -> hidden, in fp32
    and under bf16 autocast, interleaved. On a CPU: one core, timed in the thread's CPU time, so that
    other work on the machine does not decide (the ratio is a property of the core)."""
    if device.type == "cpu":
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return _time_precisions(device, hidden, intermediate, seconds, time.thread_time)
        finally:
            torch.set_num_threads(threads)
    return _time_precisions(device, hidden, intermediate, seconds, time.perf_counter)


def _time_precisions(device, hidden, intermediate, seconds, clock) -> tuple[float, float]:
    rows = probe_rows(hidden, intermediate)
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(rows, hidden, generator=gen).to(device)
    w1 = (torch.randn(hidden, intermediate, generator=gen) / hidden**0.5).to(device).requires_grad_()
    w2 = (torch.randn(intermediate, hidden, generator=gen) / intermediate**0.5).to(device).requires_grad_()

    def step(dtype):
        with torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            y = torch.nn.functional.gelu(x @ w1) @ w2
        y.float().square().mean().backward()
        w1.grad = w2.grad = None
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    best = {None: math.inf, torch.bfloat16: math.inf}
    for dtype in best:  # warm-up: first-call allocations and kernel selection
        step(dtype)
    deadline, rounds = time.perf_counter() + seconds, 0
    while rounds < 2 or (time.perf_counter() < deadline and rounds < 20):
        for dtype in best:
            start = clock()
            step(dtype)
            best[dtype] = min(best[dtype], clock() - start)
        rounds += 1
    return best[None], best[torch.bfloat16]


def cache_dir() -> Path:
    from cramlm.io import user_cache

    return user_cache()


def cpu_model() -> str:
    return _cpuinfo_field("model name") or platform.processor() or platform.machine()


@functools.cache
def _cpuinfo() -> dict[str, str]:
    """/proc/cpuinfo's first processor, read once ({} where there is none)."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip():
                break
            key, _, value = line.partition(":")
            fields.setdefault(key.strip().lower(), value.strip())
    except OSError:
        pass
    return fields


def _cpuinfo_field(name: str) -> str | None:
    return _cpuinfo().get(name)


def cpu_description() -> str:
    """The CPU as the precision cache and segment lines name it: its model name with its x86 family
    and model and the bf16 instructions it has (two VMs that both say "AMD EPYC" ran bf16 at 0.2x
    and 2x fp32: AVX2 only, and AVX512-BF16)."""
    family, model = _cpuinfo_field("cpu family"), _cpuinfo_field("model")
    flags = set((_cpuinfo_field("flags") or "").split())
    extra = [f"family {family}, model {model}"] if family and model else []
    extra += [f for f in ("avx512_bf16", "amx_bf16") if f in flags]
    return cpu_model() + (f" ({', '.join(extra)})" if extra else "")


def machine(device: torch.device) -> dict:
    """Which machine this process runs on, as a segment record names it (report/segments.py): the
    host name, the boot's id (VMs share host names; a new machine or a reboot has a new one), the CPU
    with its x86 family and model (VMs often report a bare "AMD EPYC"), the accelerator, torch."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:8] or None
    except OSError:
        boot = None
    accelerator = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {"host": platform.node(), "boot": boot, "cpu": cpu_description(), "accelerator": accelerator, "torch": torch.__version__}


def code_version() -> dict:
    """The cramlm that runs: its version and, when it runs from a git work tree that tracks this
    very file (not a repository that merely holds the installed package, such as a project with its
    .venv inside), the commit and whether the package's tracked files differ from it. Read when
    training starts; a copy made by ``git archive`` has no commit to read. git takes no lock."""
    import subprocess

    from cramlm import __version__

    here = Path(__file__).resolve()
    out = {"version": __version__, "commit": None, "dirty": None}
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    git = ["git", "--no-optional-locks", "-C", str(here.parent)]
    try:
        def ask(*args: str, timeout: float = 5) -> subprocess.CompletedProcess:
            return subprocess.run([*git, *args], capture_output=True, text=True, timeout=timeout, env=env)

        if ask("ls-files", "--error-unmatch", "--", here.name).returncode == 0:
            head = ask("rev-parse", "--short=12", "HEAD")
            if head.returncode == 0:
                changed = ask("status", "--porcelain", "--untracked-files=no", "--", str(here.parents[1]), timeout=10)
                out.update(commit=head.stdout.strip(), dirty=bool(changed.stdout.strip()) if changed.returncode == 0 else None)
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def machine_key(device: torch.device, hidden: int, intermediate: int) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu {cpu_description()}"
    return f"v{CACHE_VERSION} | {name} | torch {torch.__version__} | mlp {hidden}x{intermediate}"


def _read_cache(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _cached(path: Path, key: str) -> PrecisionChoice | None:
    hit = _read_cache(path).get(key)
    try:
        return PrecisionChoice(hit["precision"], hit["reason"] + " (cached)", hit["speedup"], "cache") if hit else None
    except (KeyError, TypeError):  # an entry this version does not understand: measure again
        return None


def choose_precision(device: torch.device, hidden: int = 768, intermediate: int | None = None, use_cache: bool = True) -> PrecisionChoice:
    """impl.precision=auto: bf16 autocast where it is measurably faster for these widths, else fp32."""
    intermediate = intermediate or 4 * hidden
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return PrecisionChoice("bf16", "CUDA device with bf16 support", None, "cuda")
        return PrecisionChoice("fp16", "CUDA device without bf16: fp16 with loss scaling", None, "cuda")
    if device.type != "cpu":
        return PrecisionChoice("fp32", f"{device.type}: no probe, fp32", None, "config")
    key = machine_key(device, hidden, intermediate)
    path = cache_dir() / "hardware.json"
    if use_cache and (hit := _cached(path, key)):
        return hit
    lock = None
    if use_cache:
        from filelock import FileLock  # processes of one node probe one after the other, the others read the cache

        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            lock = FileLock(str(path) + ".lock")
            lock.acquire()
        except OSError:  # no writable cache (read-only home): measure every time
            use_cache, lock = False, None
    try:
        if use_cache and (hit := _cached(path, key)):
            return hit
        fp32, bf16 = time_precisions(device, hidden, intermediate)
        precision, speedup = decide_precision(fp32, bf16)
        verdict = "faster" if precision == "bf16" else f"below the {BF16_MIN_SPEEDUP}x needed"
        reason = f"measured bf16 autocast {speedup:.2f}x fp32 at width {hidden}x{intermediate} ({verdict})"
        choice = PrecisionChoice(precision, reason, round(speedup, 3), "probe")
        if use_cache:
            data = _read_cache(path)
            data[key] = {"precision": precision, "reason": reason, "speedup": round(speedup, 3),
                         "fp32_seconds": fp32, "bf16_seconds": bf16, "measured": time.strftime("%Y-%m-%d %H:%M:%S")}
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            try:
                tmp.write_text(json.dumps(data, indent=1) + "\n")
                tmp.replace(path)
            except OSError:
                pass  # the answer stands; the next run measures again
        return choice
    finally:
        if lock is not None:
            lock.release()

