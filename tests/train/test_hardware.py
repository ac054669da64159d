"""impl.precision=auto and impl.threads=auto (train/hardware.py): the decisions from faked timings,
affinity masks and cgroup quotas; the cache; the wiring into a run's summary and MFU peak."""

from __future__ import annotations

import json

import pytest
import torch

from cramlm.train import hardware
from cramlm.train.hardware import (
    auto_threads,
    cgroup_cpu_limit,
    choose_precision,
    decide_precision,
    free_cpus,
    resolve_threads,
    usable_cpus,
)
from cramlm.train.impl import ImplConfig, autocast_dtype, resolve_precision

from .helpers import run_inprocess


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CRAMLM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "hardware.json"


def test_precision_decision_from_timings():
    assert decide_precision(fp32_seconds=1.0, bf16_seconds=0.5) == ("bf16", 2.0)  # AVX512-BF16: 2x
    assert decide_precision(1.0, 5.0) == ("fp32", 0.2)  # a CPU where bf16 is emulated and slow
    assert decide_precision(1.0, 0.95)[0] == "fp32"  # 5% is not worth bf16's rounding
    assert decide_precision(1.0, 1 / 1.1)[0] == "bf16"  # the threshold itself counts


@pytest.mark.parametrize("fp32,bf16,expected", [(0.2, 0.1, "bf16"), (0.1, 0.5, "fp32")])
def test_probe_result_is_cached_per_machine(cache, monkeypatch, fp32, bf16, expected):
    calls = []

    def fake(device, hidden, intermediate):
        calls.append((hidden, intermediate))
        return fp32, bf16

    monkeypatch.setattr(hardware, "time_precisions", fake)
    cpu = torch.device("cpu")
    first = choose_precision(cpu, 128, 512)
    assert (first.precision, first.source, first.speedup) == (expected, "probe", round(fp32 / bf16, 3))
    assert f"{fp32 / bf16:.2f}x fp32 at width 128x512" in first.reason
    again = choose_precision(cpu, 128, 512)  # the second run of this machine does not measure
    assert (again.precision, again.source) == (expected, "cache") and calls == [(128, 512)]
    choose_precision(cpu, 768, 3072)  # other widths: measured once more
    assert calls == [(128, 512), (768, 3072)]
    stored = json.loads(cache.read_text())
    assert len(stored) == 2 and all(torch.__version__ in key for key in stored)


def test_precision_on_cuda_and_explicit_settings(monkeypatch, cache):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    cuda = torch.device("cuda")
    assert autocast_dtype(ImplConfig(), cuda) is torch.bfloat16  # no probe on a bf16 GPU
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert autocast_dtype(ImplConfig(), cuda) is torch.float16  # V100, T4: fp16 with loss scaling
    assert autocast_dtype(ImplConfig(precision="fp32"), torch.device("cpu")) is None
    explicit = resolve_precision(ImplConfig(precision="bf16"), torch.device("cpu"))
    assert (explicit.precision, explicit.reason, explicit.dtype) == ("bf16", "impl.precision=bf16", torch.bfloat16)
    assert not cache.exists()  # nothing was measured


def test_the_probe_really_times_both_precisions():
    fp32, bf16 = hardware.time_precisions(torch.device("cpu"), 32, 64, seconds=0.01)
    assert fp32 > 0 and bf16 > 0
    assert hardware.probe_rows(768, 3072) % 128 == 0 and 128 <= hardware.probe_rows(32, 64) <= 8192


def test_threads_from_affinity_and_quota(tmp_path):
    assert usable_cpus(affinity={0, 1, 2, 3}) == 4
    assert usable_cpus(affinity={0, 1, 2, 3}, quota=2.0) == 2  # a container's quota caps the mask
    assert usable_cpus(affinity={0, 1, 2, 3}, quota=1.5) == 1  # two threads on 1.5 CPUs get throttled
    assert usable_cpus(affinity={0, 1}, quota=0.5) == 1
    assert usable_cpus(affinity={5}, quota=None) == 1  # taskset -c 5
    # torchrun: the usable CPUs are shared among the node's processes
    assert auto_threads(affinity=set(range(8)), quota=None, local_processes=2) == 4
    assert auto_threads(affinity={0, 1}, quota=None, local_processes=2) == 1
    assert auto_threads(affinity={0, 1}, quota=None, local_processes=4) == 1
    # cgroup files, v2 and v1
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("150000 100000\n")
    assert cgroup_cpu_limit(v2) == 1.5
    (v2 / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_limit(v2) is None
    v1 = tmp_path / "v1" / "cpu"
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_quota_us").write_text("300000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_limit(tmp_path / "v1") == 3.0
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpu_limit(tmp_path / "v1") is None
    assert cgroup_cpu_limit(tmp_path / "none") is None


STAT = """cpu  {busy} 0 0 {idle} 0 0 0 {steal} 0 0
cpu0 0 0 0 0 0 0 0 0 0 0
cpu1 0 0 0 0 0 0 0 0 0 0
intr 1 2 3
"""


def test_free_cpus_from_proc_stat():
    before = STAT.format(busy=1000, idle=1000, steal=0)
    # 1 s on 2 CPUs = 200 ticks: others busy 180 ticks (1.8 CPUs) -> 0.2 free; our own 50 ticks are not others'
    loaded = STAT.format(busy=1000 + 180 + 50, idle=1000 + 200 - 230, steal=0)
    assert free_cpus(before, loaded, own_seconds=0.5) == pytest.approx(2 - 1.8, abs=1e-9)
    idle = STAT.format(busy=1000 + 10, idle=1000 + 190, steal=0)
    assert free_cpus(before, idle, own_seconds=0.0) == pytest.approx(1.9)  # others: 10 of 100 ticks per CPU
    stolen = STAT.format(busy=1000, idle=1000 + 100, steal=100)  # the hypervisor ran another guest on one CPU
    assert free_cpus(before, stolen, own_seconds=0.0) == pytest.approx(1.0)
    # the thread count follows: a loaded 2-CPU machine gets 1 thread, an idle one 2
    assert auto_threads(affinity={0, 1}, quota=None, local_processes=1, free=0.2) == 1
    assert auto_threads(affinity={0, 1}, quota=None, local_processes=1, free=1.9) == 2
    assert auto_threads(affinity=set(range(16)), quota=4.0, local_processes=1, free=40.0) == 4  # a busy host, our quota is free
    assert auto_threads(affinity=set(range(8)), quota=None, local_processes=2, free=0.5) == 4  # torchrun ranks: not capped


def test_threads_setting(monkeypatch):
    monkeypatch.setattr(hardware.os, "sched_getaffinity", lambda pid: {0, 1, 2})
    monkeypatch.setattr(hardware, "cgroup_cpu_limit", lambda root="/sys/fs/cgroup": None)
    monkeypatch.setattr(hardware, "measure_free_cpus", lambda seconds=0.25: 3.0)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert resolve_threads("auto") == 3
    monkeypatch.setattr(hardware, "measure_free_cpus", lambda seconds=0.25: 1.2)  # others keep 1.8 CPUs busy
    assert resolve_threads("auto") == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    assert resolve_threads("auto") == 1
    assert resolve_threads(2) == 2 and resolve_threads(None) is None
    assert ImplConfig().threads == "auto"


def test_auto_precision_reaches_the_summary_and_the_peak(tmp_path, cache, monkeypatch):
    """A run with precision=auto on a machine whose probe says bf16: it trains under bf16 autocast,
    measures MFU against the bf16 GEMM peak, and its summary says what was chosen and why."""
    monkeypatch.setattr(hardware, "time_precisions", lambda device, h, i: (0.3, 0.1))
    peaks = []
    from cramlm.train import flops

    real = flops.cpu_peak_flops
    monkeypatch.setattr(flops, "cpu_peak_flops", lambda size=1024, seconds=0.5, dtype=None: peaks.append(dtype) or real(256, 0.01, dtype))
    summary = run_inprocess(tmp_path, "auto", "budget=null", "train.budget.steps=2", "impl.precision=auto")
    assert summary["precision"] == "bf16" and "3.00x fp32" in summary["precision_reason"]
    assert peaks == [torch.bfloat16] and "bf16 GEMM" in summary["peak_source"]
    on_disk = json.loads((tmp_path / "auto" / "summary.json").read_text())
    assert on_disk["precision"] == "bf16"


def test_cpu_peak_is_one_core_in_cpu_time_times_threads(monkeypatch):
    """The peak is timed in CPU time on one core, so other work on the machine cannot lower it
    (and so hide its cost from MFU); the process's threads multiply it."""
    from cramlm.train import flops

    before = torch.get_num_threads()
    assert flops.core_peak_flops(128, 0.01) > 0 and torch.get_num_threads() == before  # threads restored
    monkeypatch.setattr(flops, "core_peak_flops", lambda size=1024, seconds=0.5, dtype=None: 1e9 if dtype is None else 2e9)
    try:
        torch.set_num_threads(2)
        assert flops.cpu_peak_flops() == 2e9 and flops.cpu_peak_flops(dtype=torch.bfloat16) == 4e9
        peak, source = flops.peak_flops(torch.device("cpu"), torch.bfloat16)
        assert peak == 4e9 and source == "measured bf16 GEMM on one core (CPU time) x 2 threads"
        torch.set_num_threads(1)
        assert flops.peak_flops(torch.device("cpu"), torch.bfloat16)[1].endswith("x 1 thread")
    finally:
        torch.set_num_threads(before)


def test_steps_are_timed_in_turn_after_untimed_rounds():
    """time_interleaved: warm-up rounds untimed, then each timed round calls every step once, in
    order (A B A B: the load of the machine hits all alike); the seconds are each call's own. The
    CPU path takes the GEMM probe for the peak (gemm_peak_flops measures GPUs)."""
    import time

    from cramlm.train import flops

    calls = []
    steps = {"a": lambda: calls.append("a"), "b": lambda: (calls.append("b"), time.sleep(0.2))}
    times = flops.time_interleaved(steps, warmup=1, timed=3, device=torch.device("cpu"))
    assert calls == ["a", "b"] * 4 and {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3}
    assert min(times["b"]) >= 0.2 > max(times["a"])
    assert flops.gemm_peak_flops(torch.device("cpu"), None) == flops.cpu_peak_flops()  # cached probe: the same figure

def test_unwritable_or_damaged_cache_still_decides(tmp_path, monkeypatch):
    monkeypatch.setattr(hardware, "time_precisions", lambda device, h, i: (0.1, 0.5))
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("CRAMLM_CACHE", str(blocked / "cache"))  # cannot be created
    assert choose_precision(torch.device("cpu"), 64, 256).precision == "fp32"
    monkeypatch.setenv("CRAMLM_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    key = hardware.machine_key(torch.device("cpu"), 64, 256)
    (tmp_path / "cache" / "hardware.json").write_text(json.dumps({key: {"precision": "bf16"}}))  # an entry missing fields
    choice = choose_precision(torch.device("cpu"), 64, 256)
    assert (choice.precision, choice.source) == ("fp32", "probe")


def test_resume_keeps_the_thread_count_the_checkpoint_was_written_with():
    from cramlm.train.hardware import resume_threads

    written = {"threads": 2, "world_size": 1}
    assert resume_threads("auto", written, now=1, world=1, usable=2) == 2  # auto measured a busy machine: back to 2
    assert resume_threads("auto", written, now=2, world=1, usable=2) is None  # already the same
    assert resume_threads("auto", {"threads": 4, "world_size": 1}, now=2, world=1, usable=2) is None  # not 4 CPUs here
    assert resume_threads("auto", written, now=1, world=2, usable=2) is None  # written by another number of processes
    assert resume_threads(1, written, now=1, world=1, usable=2) is None  # a number in the config is kept
    assert resume_threads("auto", {}, now=2, world=1, usable=2) is None  # an older checkpoint without the count


def test_bare_cuda_resolves_to_the_current_device_index(monkeypatch):
    """impl.device=cuda (and auto on a GPU): torch.cuda.set_device rejects a device without an index
    (torch 2.11: "Expected a torch.device with a specified index"), so a run on a GPU would stop
    before its first step. The CUDA calls are faked here (no GPU in CI); tests/gpu runs the real ones."""
    from cramlm.train.impl import setup_device

    chosen = []
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32  # setup_device sets both
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: chosen.append(torch.device(d) if not isinstance(d, int) else d))
    try:
        for name in ("cuda", "auto"):
            device = setup_device(ImplConfig(device=name, threads=None))
            assert device == torch.device("cuda", 1) and chosen[-1] == torch.device("cuda", 1)
        assert setup_device(ImplConfig(device="cuda", threads=None), local_rank=0) == torch.device("cuda", 0)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32


@pytest.mark.parametrize("name, tflops", [("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0), ("NVIDIA H100 NVL", 835.0),
                                          ("NVIDIA H200", 989.0), ("NVIDIA H200 NVL", 835.0), ("NVIDIA A100-SXM4-80GB", 312.0),
                                          ("Some Future GPU", None)])
def test_the_gpu_peak_table_takes_the_longest_matching_name(name, tflops):
    from cramlm.train import flops

    assert flops.gpu_peak_flops(name) == (tflops * 1e12 if tflops else None)


def test_the_precision_cache_tells_apart_cpus_that_report_one_name(monkeypatch):
    """Two VMs that both say "AMD EPYC" (AVX2 only: bf16 at a fifth of fp32; AVX512-BF16: twice it)
    get separate cache entries, so a home folder shared between them never carries one's answer to the other."""
    cpus = {"zen2": {"model name": "AMD EPYC", "cpu family": "23", "model": "49", "flags": "fpu avx2"},
            "zen4": {"model name": "AMD EPYC", "cpu family": "25", "model": "17", "flags": "fpu avx2 avx512f avx512_bf16"}}
    keys = {}
    for name, info in cpus.items():
        monkeypatch.setattr(hardware, "_cpuinfo_field", info.get)
        keys[name] = hardware.machine_key(torch.device("cpu"), 128, 512)
    assert keys["zen2"] != keys["zen4"] and "family 25, model 17, avx512_bf16" in keys["zen4"], keys
    assert "(family 23, model 49)" in keys["zen2"]
