"""benchmarks/gpu_ab.py: held-out losses are compared only between runs of one objective (an ELECTRA
run's is its generator's), the contenders run in the order given, and an unknown one is an Error."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import gpu_ab  # noqa: E402


def test_only_runs_of_one_objective_are_compared_on_held_out_loss():
    result = {"runs": {"cramming": {"heldout": {"loss": 5.0, "objective": "mlm"}},
                       "cramlm-mlm": {"heldout": {"loss": 4.75, "objective": "mlm"}},
                       "cramlm": {"heldout": {"loss": 3.0, "objective": "rtd"}}}}
    pairs = gpu_ab.same_objective(result)
    assert pairs == [{"a": "cramming", "b": "cramlm-mlm", "objective": "mlm", "b_minus_a": -0.25}]
    result["same_objective"] = pairs
    assert "held-out mlm: cramlm-mlm - cramming = -0.250" in gpu_ab.table(result)


def test_a_run_without_a_held_out_loss_is_left_out():
    result = {"runs": {"cramming": {"heldout": {"loss": None, "objective": None}},
                       "cramlm-mlm": {"heldout": {"loss": 4.75, "objective": "mlm"}}}}
    assert gpu_ab.same_objective(result) == []


def test_the_mlm_contender_is_gpu_24h_with_crammings_objective_and_runs_second(tmp_path):
    assert list(gpu_ab.CONTENDERS) == ["cramming", "cramlm-mlm", "cramlm"]
    recipe, overrides = gpu_ab.CONTENDERS["cramlm-mlm"]
    cmd = gpu_ab.pretrain_cmd(recipe, overrides, "cramlm-mlm", tmp_path, "data", 1e16, dry=False)
    assert cmd[4:6] == ["gpu-24h", "name=cramlm-mlm"] and "train.objective=mlm" in cmd and "train.budget.flops=1e+16" in cmd


def test_an_unknown_contender_is_an_error_naming_it(tmp_path, capsys):
    rc = gpu_ab.main(["--out", str(tmp_path / "res"), "--work", str(tmp_path / "work"), "--data-dir", str(tmp_path),
                      "--contenders", "cramming,bert"])
    assert rc == 2 and not (tmp_path / "res").exists()
    assert capsys.readouterr().err.strip() == "Error: --contenders: bert (choose from cramming, cramlm-mlm, cramlm)"


def test_the_data_prepared_ahead_is_the_contenders_cache_and_counts_only_when_finished(tmp_path):
    """--prepare runs the data stage alone into --data-cache, which every contender then reads; a cache
    counts as prepared only with an entry's manifest (a preparation renames its entry into place whole,
    so one stopped half-way leaves only a hidden temporary folder)."""
    cache = tmp_path / "cache"
    recipe, overrides = gpu_ab.CONTENDERS["cramming"]
    prepare = gpu_ab.pretrain_cmd(recipe, overrides, "prepare-data", tmp_path / "w1", "data", 1e16, False, cache, stages="data")
    run = gpu_ab.pretrain_cmd(recipe, overrides, "cramming", tmp_path / "w2", "data", 1e16, False, cache)
    assert "stages=[data]" in prepare and "stages=[data,pretrain]" in run
    assert f"impl.data_cache={cache}" in prepare and f"impl.data_cache={cache}" in run
    assert f"impl.data_cache={tmp_path / 'w2' / 'data'}" in gpu_ab.pretrain_cmd(recipe, overrides, "cramming", tmp_path / "w2",
                                                                              "data", 1e16, False)
    assert not gpu_ab.prepared(cache)
    (cache / ".shared-corpus-2314d486f12a.tmp-123").mkdir(parents=True)
    (cache / ".shared-corpus-2314d486f12a.tmp-123" / "manifest.json").write_text("{}")  # stopped before its rename
    assert not gpu_ab.prepared(cache)
    (cache / "shared-corpus-2314d486f12a").mkdir()
    (cache / "shared-corpus-2314d486f12a" / "manifest.json").write_text("{}")
    assert gpu_ab.prepared(cache)


def test_prepare_fills_the_cache_alone_and_the_ab_then_finds_it(tmp_path):
    """`gpu_ab.py --prepare --dry` (gpu_check.sh's background step, on the shipped corpus) writes a finished
    entry into --data-cache, which ``prepared`` counts, and nothing under --out."""
    cache, out = tmp_path / "cache", tmp_path / "res"
    args = ["--out", str(out), "--work", str(tmp_path / "prep"), "--data-dir", str(tmp_path), "--data-cache", str(cache), "--dry"]
    assert not gpu_ab.prepared(cache)
    assert gpu_ab.main([*args, "--prepare"]) == 0
    assert gpu_ab.prepared(cache) and not out.exists()
    entries = [p.name for p in cache.iterdir() if not p.name.startswith(".")]
    assert len(entries) == 1 and (cache / entries[0] / "manifest.json").is_file()
