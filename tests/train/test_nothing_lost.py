"""Nothing lost, nothing unnoticed: a run folder is never restarted over, a refused resume changes
nothing, every recorded digest is required, non-finite weights are refused, and `--resume auto`
with every checkpoint damaged fails (issue 39, items 1-5); a checkpoint an older cramlm wrote is
refused with one line, not carried (issue 40, item 7)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from cramlm.io import DIGESTS, write_digests
from cramlm.train.checkpoint import checkpoint_dirs, latest_checkpoint

from .helpers import FINISHED_STEPS, copy_run, finished_run, invoke, overrides

STEPS = FINISHED_STEPS


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A tiny finished run with checkpoints at steps 1 and 2."""
    return finished_run(tmp_path_factory, "nothing-lost")


def pretrain(finished: Path, name: str, *extra: str):
    return invoke("pretrain", *overrides(finished.parent, name, *STEPS, *extra))


def contents(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (but the run lock's) and its sha256."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and ".cramlm.lock" not in p.name}


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("Error:")]


# ------------------------------------------------------------------ item 1: a folder holding a run


def test_a_fresh_pretrain_never_starts_over_a_run(finished):
    run = copy_run(finished, "demo")
    (run / "eval.json").write_text('{"checkpoint": "demo"}\n')  # the demo's evaluation, beside its run
    before = contents(run)
    result = pretrain(finished, "demo", "train.budget.steps=3")
    assert result.exit_code == 1, result.output
    (line,) = error_lines(result.output)
    for text in (str(run), "holds a run already", "--resume auto", "name=", "overwrite=true"):
        assert text in line, (text, line)
    assert "Traceback" not in result.output
    assert contents(run) == before  # nothing deleted, nothing written


def test_overwrite_true_deletes_the_old_run_whole(finished):
    run = copy_run(finished, "replaced")
    (run / "eval.json").write_text('{"checkpoint": "replaced"}\n')
    old_checkpoints = [p.name for p in checkpoint_dirs(run / "checkpoints")]
    result = pretrain(finished, "replaced", "train.budget.steps=1", "overwrite=true")
    assert result.exit_code == 0, result.output
    assert not (run / "eval.json").exists()  # nothing of the old run mixes with the new one
    assert [p.name for p in checkpoint_dirs(run / "checkpoints")] == ["step-00000001"] != old_checkpoints
    assert len((run / "config-history.jsonl").read_text().splitlines()) == 1


def test_resume_auto_of_a_finished_run_whose_checkpoints_were_removed_is_refused(finished):
    """resume=auto finding no checkpoint where a run finished (summary.json): refused, nothing
    written (it would train the run again from step 0 over its log and weights)."""
    import shutil

    run = copy_run(finished, "no-checkpoints")
    shutil.rmtree(run / "checkpoints")
    before = contents(run)
    result = pretrain(finished, "no-checkpoints", "resume=auto")
    assert result.exit_code == 1, result.output
    (line,) = error_lines(result.output)
    assert f"{run} holds a finished run (summary.json) and no checkpoint to continue it from" in line and "overwrite=true" in line, line
    assert contents(run) == before


def test_overwrite_and_resume_together_are_refused(finished):
    result = pretrain(finished, "both", "overwrite=true", "resume=auto")
    assert result.exit_code == 1 and "overwrite=true starts the run afresh" in result.output, result.output


def test_cramlm_run_refuses_a_folder_of_another_recipe_or_a_bare_pretrain(finished):
    run = copy_run(finished, "other-recipe")
    (run / "pipeline.json").write_text(json.dumps({"name": "other-recipe", "recipe": "cpu-1h", "stages": {}}))
    before = contents(run)
    result = invoke("run", "default", f"base_dir={finished.parent}", "name=other-recipe")
    assert result.exit_code == 1, result.output
    (line,) = error_lines(result.output)
    assert "recipe cpu-1h's run" in line and "overwrite=true" in line, line
    assert contents(run) == before
    copy_run(finished, "bare")  # `cramlm pretrain`'s folder: no pipeline record
    result = invoke("run", "default", f"base_dir={finished.parent}", "name=bare")
    assert result.exit_code == 1 and "`cramlm pretrain` run" in result.output, result.output
    # a resume continues its own recipe's run, never takes over another's (was: the record renamed)
    result = invoke("run", "default", f"base_dir={finished.parent}", "name=other-recipe", "--resume", "auto")
    assert result.exit_code == 1, result.output
    (line,) = error_lines(result.output)
    assert "holds recipe cpu-1h's run: resume it with `cramlm run cpu-1h name=other-recipe --resume auto`" in line, line
    assert contents(run) == before


def test_eval_refuses_an_out_dir_holding_another_checkpoints_results(finished, tmp_path):
    out = tmp_path / "results"
    out.mkdir()
    (out / "eval.json").write_text(json.dumps({"checkpoint": "other", "source": "/somewhere/other", "results": []}))
    before = (out / "eval.json").read_bytes()
    args = ("eval", f"base_dir={finished.parent}", "name=base", f"out_dir={out}", "eval.lm_eval=false")
    result = invoke(*args)
    assert result.exit_code == 1, result.output
    (line,) = error_lines(result.output)
    assert str(out / "eval.json") in line and "another checkpoint" in line and "overwrite=true" in line, line
    assert (out / "eval.json").read_bytes() == before


# ------------------------------------------------------------------ item 2: a refused resume changes nothing


def resume(finished: Path, name: str, *extra: str, allow: tuple[str, ...] = ()):
    flags = [a for key in allow for a in ("--allow-change", key)]
    return invoke("pretrain", "--resume", "auto", *flags, *overrides(finished.parent, name, *STEPS, "train.budget.steps=3", *extra))


def test_a_change_no_checkpoint_can_serve_is_refused_by_the_config_check(finished):
    run = copy_run(finished, "to-muon")
    before = contents(run)
    result = resume(finished, "to-muon", "train.optim.type=muon", allow=("train.optim",))
    assert result.exit_code == 1, result.output
    (line,) = error_lines(result.output)
    assert "train.optim.type adamw -> muon" in line and "optimizer state" in line, line
    assert contents(run) == before  # config.yaml, config-history.jsonl: byte-identical
    result = resume(finished, "to-muon", "train.objective=rtd", allow=("train",))
    (line,) = error_lines(result.output)
    assert result.exit_code == 1 and "train.objective mlm -> rtd" in line and "tokenizer" not in line, line
    assert contents(run) == before


def test_a_resume_whose_load_fails_writes_nothing(finished):
    import torch

    run = copy_run(finished, "load-fails")
    newest = latest_checkpoint(run / "checkpoints")
    torch.save({"optimizer": {}, "scaler": {}}, newest / "training.pt")  # verifies (digests rewritten), loads nothing
    write_digests(newest, ["training.pt"])
    before = contents(run)
    result = resume(finished, "load-fails", "train.optim.lr=5e-3", allow=("train.optim.lr",))
    assert result.exit_code == 1, result.output
    (line,) = error_lines(result.output)
    assert f"resume from {newest}" in line, line
    after = contents(run)
    for name in ("config.yaml", "config-history.jsonl", "tokenizer.json", "metrics.jsonl"):
        assert after[name] == before[name], name


# ------------------------------------------------------------------ item 3: every recorded digest is required


def drop_digest_entry(folder: Path, name: str) -> None:
    record = json.loads((folder / DIGESTS).read_text())
    del record["files"][name]
    (folder / DIGESTS).write_text(json.dumps(record))


def flip_a_weight_byte(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[-3] ^= 0x01  # in the last tensor's data: a small change of one weight, not a NaN
    path.write_bytes(bytes(raw))


def test_a_removed_digest_entry_is_damage(finished, capsys):
    run = copy_run(finished, "no-entry")
    newest = latest_checkpoint(run / "checkpoints")
    flip_a_weight_byte(newest / "model.safetensors")
    drop_digest_entry(newest, "model.safetensors")
    result = resume(finished, "no-entry")
    assert result.exit_code == 0, result.output
    assert "records no digest of model.safetensors" in capsys.readouterr().out + result.output
    assert "step-00000001 (step 1)" in result.output and (run / "checkpoints" / f"{newest.name}.damaged").is_dir()
    run = copy_run(finished, "no-entry-run")
    flip_a_weight_byte(run / "model.safetensors")
    drop_digest_entry(run, "model.safetensors")
    result = invoke("eval", f"base_dir={finished.parent}", "name=no-entry-run", "eval.lm_eval=false")
    assert result.exit_code == 1, result.output
    (line,) = error_lines(result.output)
    assert str(run / "model.safetensors") in line and "records no digest" in line, line


def test_a_stop_while_save_run_replaces_a_runs_weights_never_leaves_two_saves_in_use(tmp_path, monkeypatch):
    """save_run replaces an ELECTRA run's two weight files (model.safetensors, electra.safetensors)
    through io.replace_digested: stopped after both renames but before digests.json settles, the
    run loads (the pending digests); stopped between the renames (new model, old generator and
    detector), each file is refused, naming the other, until a save ends (was: a new
    model.safetensors against its old digest, refused as damage; and with pending digests checked a
    file at a time, the two saves' files used together); a killed writer's temporaries are cleared."""
    import yaml

    import cramlm.io as io
    from cramlm.config.loader import validate
    from cramlm.run.build import load_run
    from cramlm.run.config import PretrainConfig
    from cramlm.run.folder import save_run
    from cramlm.train.checkpoint import verified_weights
    from cramlm.train.distributed import Dist

    from .helpers import run_inprocess

    summary = run_inprocess(tmp_path, "electra", "train.objective=rtd", *STEPS)
    run = tmp_path / "electra"
    cfg = validate(PretrainConfig, yaml.safe_load((run / "config.yaml").read_text()))
    first = checkpoint_dirs(run / "checkpoints")[0]
    names = ["model.safetensors", "electra.safetensors"]
    final = {n: (run / n).read_bytes() for n in names}

    def save(checkpoint, **patches):
        with monkeypatch.context() as patched:
            for name, fn in patches.items():
                patched.setattr(io, name, fn)
            save_run(cfg, Dist(), {**summary, "final_checkpoint": str(checkpoint)}, lambda line: None)

    settle, rename = io.write_digests, io.os.replace

    def stop_at_settling(folder, names, known=None, pending=None):
        if known is not None:
            raise KeyboardInterrupt
        settle(folder, names, known, pending)

    with pytest.raises(KeyboardInterrupt):
        save(first, write_digests=stop_at_settling)
    assert all((run / n).read_bytes() != final[n] for n in names) and "pending" in json.loads((run / DIGESTS).read_text())
    load_run(run) and verified_weights(run / "electra.safetensors")  # all new: accepted
    (run / ".model.safetensors.tmp-1").write_bytes(b"a killed writer's")
    (run / "..model.safetensors.tmp-1.tmp-1").write_bytes(b"and of save_safetensors' own atomic write into it")
    save(first)  # a save that ends: settled, no pending, no temporaries left
    assert "pending" not in json.loads((run / DIGESTS).read_text()) and not list(run.glob(".*.tmp-*"))

    class Os:  # io's os, stopping the save at electra.safetensors' rename into place (model.safetensors' done)
        def __getattr__(self, name):
            return getattr(__import__("os"), name)

        def replace(self, a, b):
            if Path(b) == run / "electra.safetensors":
                raise KeyboardInterrupt
            rename(a, b)

    with pytest.raises(KeyboardInterrupt):
        save(summary["final_checkpoint"], os=Os())
    assert (run / "model.safetensors").read_bytes() == final["model.safetensors"]  # new, the other old
    for name, other in (("model.safetensors", "electra.safetensors"), ("electra.safetensors", "model.safetensors")):
        with pytest.raises(io.CheckpointFileError, match=f"{name} and {other} are from two saves"):
            verified_weights(run / name)
    save(summary["final_checkpoint"])
    load_run(run) and verified_weights(run / "electra.safetensors")

    def full(tensors, path, metadata=None):  # safetensors' own error for a full disk wraps the OS error in text
        raise RuntimeError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: \"No space left on device\" })")

    with monkeypatch.context() as patched, pytest.raises(OSError, match="disk full writing the run's model.safetensors and "
                                                          "electra.safetensors from its final checkpoint .*, which is intact"):
        patched.setattr("cramlm.run.folder.save_safetensors", full)
        save_run(cfg, Dist(), {**summary, "final_checkpoint": summary["final_checkpoint"]}, lambda line: None)
    load_run(run) and verified_weights(run / "electra.safetensors")  # the old save stands (these raise otherwise)
    assert not list(run.glob(".*.tmp-*"))
    flip_a_weight_byte(run / "model.safetensors")
    with pytest.raises(io.CheckpointFileError, match="does not match its digest"):
        load_run(run)


# ------------------------------------------------------------------ item 4: non-finite weights


def put_nan(path: Path) -> str:
    """A NaN in the first floating tensor of a safetensors file (its digest rewritten to match)."""
    import torch
    from safetensors.torch import load_file, save_file

    state = load_file(str(path))
    key = next(k for k, v in state.items() if v.is_floating_point())
    state[key].view(-1)[0] = float("nan")
    save_file(state, str(path), metadata={"format": "pt"})
    write_digests(path.parent, [path.name])
    assert not torch.isfinite(load_file(str(path))[key]).all()
    return key


def test_nan_weights_are_refused_for_eval_export_and_resume(finished, tmp_path):
    run = copy_run(finished, "nan")
    key = put_nan(run / "model.safetensors")
    for args in (("eval", f"base_dir={finished.parent}", "name=nan", "eval.lm_eval=false"),
                 ("export", "hf", str(run), str(tmp_path / "hf"))):
        result = invoke(*args)
        assert result.exit_code == 1, result.output
        (line,) = error_lines(result.output)
        assert str(run / "model.safetensors") in line and key in line and "non-finite" in line, line
    assert not (run / "eval.json").exists() and not (tmp_path / "hf").exists()
    newest = latest_checkpoint(run / "checkpoints")
    key = put_nan(newest / "model.safetensors")
    result = resume(finished, "nan")
    assert result.exit_code == 1, result.output
    (line,) = error_lines(result.output)
    assert str(newest / "model.safetensors") in line and key in line, line


def test_results_stay_strict_json():
    from cramlm.io import finite_json

    assert json.dumps(finite_json({"loss": float("nan"), "rows": [1.0, float("inf"), (2, float("-inf"))]}),
                      allow_nan=False) == '{"loss": null, "rows": [1.0, null, [2, null]]}'


# ------------------------------------------------------------------ item 5: every checkpoint damaged


def test_resume_auto_with_every_checkpoint_damaged_fails(finished):
    run = copy_run(finished, "all-damaged")
    for folder in checkpoint_dirs(run / "checkpoints"):
        (folder / "training.pt").write_bytes(b"not a checkpoint")
    result = resume(finished, "all-damaged")
    assert result.exit_code == 1, result.output
    (line,) = error_lines(result.output)
    assert "every checkpoint" in line and "step-00000001.damaged" in line and "step-00000002.damaged" in line, line
    assert not checkpoint_dirs(run / "checkpoints") and (run / "model.safetensors").is_file()
    result = resume(finished, "all-damaged")  # the requeued job's next attempt fails alike
    assert result.exit_code == 1 and "every checkpoint" in result.output, result.output


# ------------------------------------------------------------------ issue 40 item 7: an older cramlm's checkpoint


def test_a_checkpoint_whose_data_state_is_format_1_is_refused_and_changes_nothing(finished):
    import torch

    from cramlm.io import CheckpointFileError
    from cramlm.train.checkpoint import check_data_state

    run = copy_run(finished, "format-1")
    newest = latest_checkpoint(run / "checkpoints")
    training = torch.load(newest / "training.pt", weights_only=True)
    data = training["data"]
    assert data["format"] == 2  # (else this test proves nothing)
    # the data state as format 1 wrote it: no format, the stream (with its world_size), the collator's
    # generator (masks drawn in sequence, global batches)
    generator = {"generator": torch.Generator().manual_seed(0).get_state()}
    training["data"] = {"stream": {**data["stream"], "world_size": 1}, "collator": generator}
    torch.save(training, newest / "training.pt")
    write_digests(newest, ["training.pt"])  # as that checkpoint would record it: not damage
    before = contents(run)
    result = resume(finished, "format-1")
    assert result.exit_code == 1, result.output
    (line,) = error_lines(result.output)
    assert line == (f"Error: resume from {newest}: its data state is format 1 (written by cramlm before masks were "
                    "keyed by stream position); this cramlm cannot continue it bit for bit: start the run fresh "
                    "(or resume with the cramlm that wrote it)"), line
    assert "Traceback" not in result.output
    assert contents(run) == before  # nothing set aside, written or removed
    # a format-2 state of a run that continued format 1 (masks drawn in sequence), a newer format
    for state, text in [({**data, "masks": "sequential", "collator": generator}, "continues a format-1 run"),
                        ({**data, "format": 3}, "format 3, newer than this cramlm reads")]:
        torch.save({**training, "data": state}, newest / "training.pt")
        with pytest.raises(CheckpointFileError, match=f"resume from {re.escape(str(newest))}: its data state .*{text}"):
            check_data_state(newest)


def test_a_checkpoint_of_version_1_or_without_its_runs_record_is_refused_not_set_aside(finished):
    run = copy_run(finished, "version-1")
    newest = latest_checkpoint(run / "checkpoints")
    state = json.loads((newest / "state.json").read_text())
    assert "data_position" not in state and state["first_loss"] is not None  # the position lives in training.pt
    (newest / "state.json").write_text(json.dumps({k: v for k, v in state.items() if k != "run"}))
    write_digests(newest, ["state.json"])
    before = contents(run)
    result = resume(finished, "version-1")
    assert result.exit_code == 1, result.output
    (line,) = error_lines(result.output)
    assert f"resume from {newest}: its state.json holds no record of its run" in line and "start the run fresh" in line, line
    assert contents(run) == before
    # version 1: no checkpoint_version, no digests.json (neither is damage: nothing is set aside)
    del state["checkpoint_version"]
    (newest / "state.json").write_text(json.dumps(state))
    (newest / DIGESTS).unlink()
    before = contents(run)
    result = resume(finished, "version-1")
    assert result.exit_code == 1, result.output
    (line,) = error_lines(result.output)
    assert f"resume from {newest}: it is a checkpoint of version 1" in line and "start the run fresh" in line, line
    assert contents(run) == before and newest.is_dir()


def test_a_full_disk_under_metrics_jsonl_holds_its_lines_and_training_goes_on(tmp_path, monkeypatch):
    """While the disk is full (writes 8-15 fail, the first after half its bytes) the run trains on,
    the file keeps only whole lines, and every line is written in order once there is space: one
    warning, one line saying so (a checkpoint that cannot be written is handled the same way)."""
    import errno

    import cramlm.train.metrics as metrics

    calls = []

    class FullForAWhile:
        def __init__(self, real):
            self.real = real

        def write(self, data):
            calls.append(len(data))
            if 8 <= len(calls) < 16:
                if len(calls) == 8:
                    self.real.write(data[: len(data) // 2])  # a torn line, cut back
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.real.write(data)

        def __getattr__(self, name):
            return getattr(self.real, name)

    monkeypatch.setattr(metrics, "open", lambda *a, **k: FullForAWhile(open(*a, **k)), raising=False)
    result = invoke("pretrain", *overrides(tmp_path, "full", "budget=null", "train.budget.steps=12", "train.checkpoint_every=0"))
    assert result.exit_code == 0, result.output
    lines = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]  # every line whole
    assert [r["step"] for r in lines if r.get("kind") == "train"] == list(range(1, 13))
    assert lines[0]["kind"] == "segment" and lines[-1]["kind"] == "finished" and len(calls) > 16
    assert result.output.count("disk full while writing") == 1 and result.output.count("the lines held while the disk was full are written") == 1


def test_a_full_disk_under_tensorboard_drops_that_sink_and_a_closing_log_writes_what_it_held(tmp_path, capsys):
    """TensorBoard's writer stays broken after a full disk (every later call raises): that sink is
    dropped with one warning and the run goes on; lines held when the run ends are written if the
    space has come back by then."""
    import errno
    from types import SimpleNamespace

    from cramlm.train.metrics import MetricsLog

    class BrokenBoard:
        def add_scalar(self, *args):
            raise OSError(errno.ENOSPC, "No space left on device")

        def close(self):
            raise OSError(errno.ENOSPC, "No space left on device")

    log = MetricsLog(tmp_path, SimpleNamespace(tensorboard=False, wandb=False), {})
    log.tb = BrokenBoard()
    log.write({"kind": "train", "step": 1, "loss": 5.0})
    log.write({"kind": "train", "step": 2, "loss": 4.0})
    assert log.tb is None and capsys.readouterr().err.count("disk full while writing TensorBoard's event file") == 1
    log.held.append(b'{"kind": "finished", "step": 2}\n')  # held while the disk was full, space back at the end
    log.full = True
    log.close()
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2, 2]
