"""The bookkeeping of benchmarks/gpu_check.sh: one ``gpu_check.json`` that every step updates as it
ends (a check cut short keeps what it measured), the GEMM peak, the figures derived from the
pretraining run, and the table printed last.

    python benchmarks/gpu_check_report.py env RES                      # device, versions
    python benchmarks/gpu_check_report.py peak RES                     # measured GEMM peak (prints it)
    python benchmarks/gpu_check_report.py step RES NAME STATUS SECONDS [FILE]
    python benchmarks/gpu_check_report.py pretrain RES RUN_DIR         # summary + steady state + MFU
    python benchmarks/gpu_check_report.py table RES
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPORT = "gpu_check.json"


def load(res: Path) -> dict:
    path = res / REPORT
    return json.loads(path.read_text()) if path.is_file() else {"steps": {}, "results": {}}


def save(res: Path, report: dict) -> None:
    tmp = res / f".{REPORT}.tmp"
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    tmp.replace(res / REPORT)


def env(res: Path) -> None:
    import torch

    report = load(res)
    cuda = torch.cuda.is_available()
    info = {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "dry": os.environ.get("GPU_CHECK_DRY") == "1",
        "python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "device_count": torch.cuda.device_count() if cuda else 0,
        "capability": ".".join(map(str, torch.cuda.get_device_capability(0))) if cuda else None,
        "memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1) if cuda else None,
        "cpus": os.cpu_count(), "commit": os.environ.get("GPU_CHECK_COMMIT", "unknown"),
    }
    for name in ("transformers", "triton", "pydantic", "omegaconf"):
        try:
            info[name] = __import__(name).__version__
        except Exception as e:  # report, never stop the check
            info[name] = f"missing ({type(e).__name__})"
    report["environment"] = info
    save(res, report)
    print(json.dumps(info))


def peak(res: Path) -> None:
    import torch

    from cramlm.train.flops import gemm_peak_flops

    cuda = torch.cuda.is_available() and os.environ.get("GPU_CHECK_DRY") != "1"
    device = torch.device("cuda" if cuda else "cpu")
    flops = {"bf16": gemm_peak_flops(device, torch.bfloat16)} if cuda else {"fp32": gemm_peak_flops(device, None)}
    report = load(res)
    report["results"]["peak"] = {"device": str(device), "gemm_flops": flops,
                                 "note": "median of 20 8192^3 products of random matrices (CUDA events)" if cuda
                                 else "cramlm's CPU fp32 GEMM probe"}
    save(res, report)
    print(next(iter(flops.values())))  # the one number the shell passes on as --peak-flops


def pytest_summary(xml: Path) -> dict:
    root = ET.parse(xml).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    out = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    out["passed"] = out["tests"] - out["failures"] - out["errors"] - out["skipped"]
    bad = []
    for case in root.iter("testcase"):
        for kind in ("failure", "error"):
            node = case.find(kind)
            if node is not None:
                bad.append({"test": f"{case.get('classname')}::{case.get('name')}", "kind": kind,
                            "message": (node.get("message") or "")[:500]})
    out["not_passed"] = bad
    return out


def step(res: Path, name: str, status: str, seconds: str, file: str | None = None) -> None:
    report = load(res)
    entry = {"status": status, "seconds": int(seconds)}
    if file and Path(file).is_file():
        path = Path(file)
        try:
            if path.suffix == ".xml":
                report["results"][name] = pytest_summary(path)
            elif path.suffix == ".jsonl":
                report["results"][name] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            else:
                report["results"][name] = json.loads(path.read_text())
        except Exception as e:  # a half-written file from a step cut short
            entry["note"] = f"could not read {path.name}: {type(e).__name__}: {e}"
    report["steps"][name] = entry
    save(res, report)


def pretrain(res: Path, run_dir: str) -> None:
    """Tokens/s and MFU of `cramlm pretrain`: end to end as its summary states them (every step
    after the first, which holds compilation), steady state (median of the second half of the
    logged windows), both also against the measured GEMM peak. A run cut short (no summary.json)
    still gives its steady state from the metrics it logged."""
    run = Path(run_dir)
    report = load(res)
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").is_file() else {}
    records = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:  # a line cut short by the kill that ended a timed-out run
            pass
    train = [r for r in records if r.get("kind") == "train" and r.get("step", 0) > 1]
    steady = statistics.median(r["tokens_per_second"] for r in train[len(train) // 2:]) if train else None
    measured = next(iter(report["results"].get("peak", {}).get("gemm_flops", {}).values()), None)
    fpt = summary.get("flops_per_token")
    derived = {
        "tokens_per_second": summary.get("tokens_per_second"),
        "mfu_vs_table_peak": summary.get("mfu"), "table_peak_flops": summary.get("peak_flops"),
        "steady_tokens_per_second": round(steady, 1) if steady else None,
        "measured_peak_flops": measured, "flops_per_token": fpt,
    }
    if measured and fpt:
        for key, tps in (("mfu_vs_measured_peak", summary.get("tokens_per_second")), ("steady_mfu_vs_measured_peak", steady)):
            derived[key] = round(tps * fpt / measured, 4) if tps else None
    if steady:
        derived["tokens_in_24h_at_steady_rate"] = round(steady * 86400)
    report["results"]["pretrain"] = {"summary": summary or None, "derived": derived}
    if ((summary.get("steps") or 0) < 3 or not steady) and report["steps"].get("pretrain", {}).get("status") == "ok":  # ran, measured nothing steady
        report["steps"]["pretrain"]["status"] = f"no steady state ({summary.get('steps')} steps)"
    save(res, report)
    print(json.dumps(derived))


def _pct(x) -> str:
    return f"{100 * x:.1f}%" if isinstance(x, (int, float)) else "-"


def table(res: Path) -> int:
    """The short table printed last; exit status = number of steps not ok."""
    report = load(res)
    e, steps, results = report.get("environment", {}), report["steps"], report["results"]
    print(f"\ngpu_check on {e.get('device')} (torch {e.get('torch')}, CUDA {e.get('cuda')}, commit {e.get('commit')})"
          + (" [dry]" if e.get("dry") else "") + f"; results in {res}")
    print("| step | status | seconds | result |")
    print("|---|---|---:|---|")
    bad = 0
    for name, s in steps.items():
        bad += s["status"] != "ok"
        r, text = results.get(name), ""
        if name == "pytest" and r:
            text = f"{r['passed']} passed, {r['failures'] + r['errors']} failed, {r['skipped']} skipped"
            text += "".join(f"; FAILED {b['test']}" for b in r["not_passed"][:4])
        elif name == "peak" and r:
            text = ", ".join(f"{k} GEMM {v / 1e12:.3g} TFLOP/s" for k, v in r["gemm_flops"].items())
        elif name.startswith("model_step") and r:
            text = "; ".join(f"{x['size']}: {x['speedup']:.2f}x HF (median {x['speedup_median']:.2f}x), MFU {_pct(x['mfu'].get('crammed-bert'))}"
                             + (f", docs flex/dense {x['flex_vs_dense']:.2f}x" if "flex_vs_dense" in x else "")
                             + (f", loss chunks GPU/CPU {x['gpu_vs_cpu_chunks']:.2f}x" if "gpu_vs_cpu_chunks" in x else "") for x in r)
        elif name.startswith("train_step") and r:
            text = "; ".join(f"{x['size']} {x['engine']}: {x['tokens_per_second']:,.0f} tok/s, MFU {_pct(x['mfu_vs_gemm_peak'])}"
                             for x in r.get("rows", []) if "skipped" not in x)
        elif name == "pretrain" and isinstance(r, dict) and "derived" in r:
            d = r["derived"]
            text = (f"{d['tokens_per_second'] or 0:,.0f} tok/s end to end (MFU {_pct(d.get('mfu_vs_measured_peak'))} of measured, "
                    f"{_pct(d.get('mfu_vs_table_peak'))} of table peak), steady {d['steady_tokens_per_second'] or 0:,.0f} tok/s "
                    f"(MFU {_pct(d.get('steady_mfu_vs_measured_peak'))}); {r['summary'].get('steps')} steps, loss "
                    f"{r['summary'].get('first_loss')} -> {r['summary'].get('last_loss')}")
        elif name == "eval" and r:
            text = ", ".join(f"{x['task']} {100 * x['score']:.1f}" for x in r.get("results", []))
            held = r.get("heldout") or r.get("lm")  # (lm: eval.json before heldout-v1)
            if held:
                text += f"; held-out {held.get('objective')} loss {held.get('loss'):.3f}"
        if s.get("note"):
            text += f" ({s['note']})"
        print(f"| {name} | {s['status']} | {s['seconds']} | {text} |")
    return bad


if __name__ == "__main__":
    command, res, *rest = sys.argv[1:]
    res = Path(res)
    if command == "table":
        sys.exit(min(table(res), 100))
    {"env": env, "peak": peak, "step": step, "pretrain": pretrain}[command](res, *rest)
