"""FLOPs and MFU: FLOPs per token (the model's own count, or FlopCounterMode on one step), the
device's peak (the GPU data-sheet table, or a GEMM probe on one CPU core; ``gemm_peak_flops``
measures a GPU's), and so the model FLOP utilisation a run reports; ``time_interleaved`` times
contenders' steps side by side, the way the benchmarks compare them, and ``profile_steps`` shows
where one step of each spends its time. The metric sinks are in
metrics.py."""

from __future__ import annotations

import inspect
import statistics
import time
from functools import lru_cache

import torch

from cramlm.constants import IGNORE_INDEX

# dense bf16 tensor-core peak, TFLOP/s, from the vendors' data sheets (no sparsity)
PEAK_TFLOPS = {
    "H200": 989.0,  # SXM
    "H200 NVL": 835.0,
    "H100": 989.0,  # SXM
    "H100 PCIe": 756.0,
    "H100 NVL": 835.0,
    "H800": 989.0,
    "GH200": 989.0,
    "B200": 2250.0,
    "A100": 312.0,
    "A800": 312.0,
    "A10G": 70.0,
    "A10": 125.0,
    "L40S": 362.0,
    "L40": 181.0,
    "L4": 121.0,
    "RTX A6000": 155.0,
    "RTX 6000 Ada": 364.0,
    "RTX 4090": 165.0,
    "RTX 3090": 71.0,
    "V100": 125.0,  # fp16
    "T4": 65.0,  # fp16
}


def gpu_peak_flops(name: str) -> float | None:
    """Peak FLOP/s of a GPU by its name (longest matching table key wins)."""
    for key in sorted(PEAK_TFLOPS, key=len, reverse=True):
        if key.lower() in name.lower():
            return PEAK_TFLOPS[key] * 1e12
    return None


@lru_cache(maxsize=None)
def core_peak_flops(size: int = 1024, seconds: float = 0.5, dtype: torch.dtype | None = None) -> float:
    """GEMM FLOP per CPU-second of one core (best of short bursts, timed in the calling thread's
    CPU time with torch on one thread), in fp32 or in ``dtype`` (bf16: the peak that bf16 autocast
    can reach, often 2x fp32 where the CPU has it). CPU time, not wall time: other work on a
    shared machine slows the run, and a peak measured in wall time would slow down with it and
    hide that from MFU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
        torch.mm(a, b)  # warm-up
        best, deadline = 0.0, time.perf_counter() + seconds
        while not best or time.perf_counter() < deadline:  # one burst at least, however late it starts
            start = time.thread_time()
            for _ in range(4):
                torch.mm(a, b)
            best = max(best, 4 * 2 * size**3 / max(time.thread_time() - start, 1e-9))
    finally:
        torch.set_num_threads(threads)
    return best


def cpu_peak_flops(size: int = 1024, seconds: float = 0.5, dtype: torch.dtype | None = None) -> float:
    """Peak GEMM FLOP/s of this process's torch threads: one core's CPU-time rate x threads (GEMMs
    scale linearly over cores: on an idle 2-core machine 2 x 98.7 against 197 GFLOP/s measured
    with both threads in wall time)."""
    return core_peak_flops(size, seconds, dtype) * torch.get_num_threads()


def gemm_peak_flops(device: torch.device, dtype: torch.dtype | None, n: int = 8192, reps: int = 20) -> float:
    """Measured dense matrix-product FLOP/s of the device: the median of ``reps`` n x n x n products
    of random matrices (never zeros: they run faster), timed with CUDA events after a warm-up; on a
    CPU, the fp32 GEMM probe (``cpu_peak_flops``). ``dtype`` None: fp32 (TF32 if torch allows it)."""
    if device.type != "cuda":
        return cpu_peak_flops()
    a, b = (torch.randn(n, n, device=device, dtype=dtype or torch.float32) for _ in range(2))
    for _ in range(3):
        a @ b
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:
        start.record()
        a @ b
        end.record()
    torch.cuda.synchronize(device)
    ms = statistics.median(start.elapsed_time(end) for start, end in events)
    return 2 * n**3 / (ms / 1e3)


def time_interleaved(steps: dict, warmup: int, timed: int, device: torch.device) -> dict[str, list[float]]:
    """Wall-clock seconds of each of ``steps`` (name -> a callable doing one step), called in turn
    (A B A B ...) so that the load of a shared machine hits all alike: ``warmup`` untimed rounds,
    then ``timed`` rounds; {name: [seconds of each timed round]}. On CUDA each step is synchronised
    before and after (the work is timed, not its launch)."""
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        for step in steps.values():
            step()
    times = {name: [] for name in steps}
    for _ in range(timed):
        for name, step in steps.items():
            sync()
            start = time.perf_counter()
            step()
            sync()
            times[name].append(time.perf_counter() - start)
    return times


def profile_steps(contenders: dict, size: str, device: torch.device) -> None:
    """One step of each contender under torch.profiler: the ops by host (self CPU) time, and on a GPU
    by device time; the host side is where a step's time beyond its kernels goes."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    for name, step in contenders.items():
        with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
            step()
            if cuda:
                torch.cuda.synchronize(device)
        table = prof.key_averages()
        print(f"--- {size} {name}: one step, by self CPU time ---")
        print(table.table(sort_by="self_cpu_time_total", row_limit=15))
        if cuda:
            print(f"--- {size} {name}: one step, by self CUDA time ---")
            print(table.table(sort_by="self_cuda_time_total", row_limit=10))


def peak_flops(device: torch.device, dtype: torch.dtype | None = None) -> tuple[float | None, str]:
    """(peak FLOP/s per process, where it comes from), for the precision in use: ``dtype`` is the
    autocast dtype (None: fp32). MFU against the fp32 peak would flatter a bf16 run by up to 2x."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peak = gpu_peak_flops(name)
        return peak, f"{name} bf16 table" if peak else f"{name}: not in the peak table"
    from cramlm.train.hardware import PRECISION_DTYPES

    label = next((name for name, d in PRECISION_DTYPES.items() if d == dtype), str(dtype))
    n = torch.get_num_threads()
    return cpu_peak_flops(dtype=dtype), f"measured {label} GEMM on one core (CPU time) x {n} thread{'s' * (n != 1)}"


def measure_flops_per_token(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> float:
    """Training FLOPs (forward + backward) per input token, counted by torch's FlopCounterMode on
    one real step (matmuls and attention; what MFU counts). Gradients are cleared afterwards."""
    from torch.utils.flop_counter import FlopCounterMode

    with torch.random.fork_rng(devices=[]), FlopCounterMode(display=False) as counter:
        model(**batch)["loss"].backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops() / batch["input_ids"].numel()


def flops_per_token(model: torch.nn.Module, seq_len: int, sample: dict[str, torch.Tensor] | None) -> tuple[float, str]:
    """The model's own count if it has one, else a measurement on ``sample``, else 6 * params."""
    if hasattr(model, "flops_per_token"):
        kwargs = {}
        if sample is not None and "labels" in sample and "predicted_fraction" in inspect.signature(model.flops_per_token).parameters:
            # sparse MLM prediction runs the head only where labels are scored (IGNORE_INDEX = unscored)
            kwargs["predicted_fraction"] = float((sample["labels"] != IGNORE_INDEX).float().mean())
        return float(model.flops_per_token(seq_len, **kwargs)), "model.flops_per_token"
    if sample is not None:
        if next(model.parameters()).is_meta:  # counted without data: a model built on the meta device
            sample = {k: v.to("meta") for k, v in sample.items()}
        return measure_flops_per_token(model, sample), "FlopCounterMode"
    return 6.0 * sum(p.numel() for p in model.parameters()), "6 * parameters"
