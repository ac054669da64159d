"""Sharded checkpoints (impl.checkpoint_format=sharded, train/sharded.py) on one process: the folder's
files and digests, a resume that continues bit for bit, a damaged shard set aside, DCP's pickled index
read without running code, and a sharded run exported exactly. Several processes: test_resharding.py."""

import json
import pickle
import shutil

import pytest
import torch
from safetensors.torch import load_file

from cramlm.io import DIGESTS, file_digest
from cramlm.train import sharded
from cramlm.train.checkpoint import checkpoint_problem, sharded_checkpoint_problem

from .helpers import losses, records, run_inprocess

SETUP = ["budget=null", "train.budget.steps=4", "train.checkpoint_every=2", "train.keep_checkpoints=5",
         "train.optim.lr=3e-3", "train.validate_every=0", "impl.checkpoint_format=sharded"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A sharded run of 4 steps (checkpoints at 2 and 4) and its full-format twin."""
    tmp = tmp_path_factory.mktemp("sharded")
    run_inprocess(tmp, "sharded", *SETUP)
    run_inprocess(tmp, "full", *SETUP, "impl.checkpoint_format=full")
    return tmp


def copy_run(runs, tmp_path, steps=(2,)):
    for step in steps:
        name = f"step-{step:08d}"
        shutil.copytree(runs / "sharded" / "checkpoints" / name, tmp_path / "copy" / "checkpoints" / name)


def test_folder_holds_shards_index_and_digests_of_every_file(runs):
    folder = runs / "sharded" / "checkpoints" / "step-00000004"
    names = sorted(p.name for p in folder.iterdir())
    assert names == [".metadata", "__0_0.distcp", DIGESTS, "state.json", "training.pt"]
    recorded = json.loads((folder / DIGESTS).read_text())["files"]
    assert sorted(recorded) == [".metadata", "__0_0.distcp", "state.json", "training.pt"]
    assert all(recorded[n] == file_digest(folder / n) for n in recorded)
    assert json.loads((folder / "state.json").read_text())["checkpoint_format"] == "sharded"
    assert checkpoint_problem(folder) is None
    # training.pt holds the optimizer's param groups, no tensors of it (those are in the shards)
    training = torch.load(folder / "training.pt", weights_only=True)
    assert "param_groups" in training["optimizer"] and "state" not in training["optimizer"]
    shapes = sharded.weight_shapes(folder)
    assert shapes == {k: tuple(v.shape) for k, v in load_file(str(runs / "full" / "model.safetensors")).items()}


def test_the_format_changes_nothing_and_a_resume_continues_bit_for_bit(runs, tmp_path):
    assert losses(runs / "sharded") == losses(runs / "full")
    a, b = load_file(str(runs / "sharded" / "model.safetensors")), load_file(str(runs / "full" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # streamed from shards = gathered
    copy_run(runs, tmp_path)
    run_inprocess(tmp_path, "copy", *SETUP, "resume=auto")
    assert losses(tmp_path / "copy") == {s: v for s, v in losses(runs / "sharded").items() if s > 2}
    c = load_file(str(tmp_path / "copy" / "model.safetensors"))
    assert all(torch.equal(a[k], c[k]) for k in a)


def test_a_damaged_shard_is_set_aside_and_the_previous_checkpoint_used(runs, tmp_path, capsys):
    copy_run(runs, tmp_path, steps=(2, 4))
    shard = tmp_path / "copy" / "checkpoints" / "step-00000004" / "__0_0.distcp"
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # one flipped byte inside a tensor: no format check sees it, the digest does
    shard.write_bytes(bytes(raw))
    run_inprocess(tmp_path, "copy", *SETUP, "resume=auto")
    assert "checkpoint step-00000004 is damaged (__0_0.distcp does not match its digest" in capsys.readouterr().out
    assert (tmp_path / "copy" / "checkpoints" / "step-00000004.damaged" / "__0_0.distcp").is_file()
    assert records(tmp_path / "copy", "event")[0]["step"] == 2  # resumed from step 2
    assert losses(tmp_path / "copy") == {s: v for s, v in losses(runs / "sharded").items() if s > 2}


@pytest.mark.parametrize("damage", ["missing shard", "unrecorded shard", "missing index"])
def test_a_missing_or_unrecorded_file_is_damage(runs, tmp_path, damage):
    folder = tmp_path / "step-00000002"
    shutil.copytree(runs / "sharded" / "checkpoints" / "step-00000002", folder)
    if damage == "missing shard":
        (folder / "__0_0.distcp").unlink()
    elif damage == "unrecorded shard":
        shutil.copyfile(folder / "__0_0.distcp", folder / "__1_0.distcp")
    else:
        (folder / ".metadata").unlink()
    expected = {"missing shard": "__0_0.distcp is missing", "unrecorded shard": "records no digest of __1_0.distcp",
                "missing index": ".metadata is missing"}[damage]
    assert expected in checkpoint_problem(folder)


class Boom:
    def __reduce__(self):
        return (print, ("this ran",))


def test_the_index_is_read_without_running_code(runs, tmp_path, capsys):
    """DCP's .metadata is a pickle: a checkpoint whose index names anything beyond DCP's records is
    refused by the allowlist (even with digests rewritten to match), and nothing of it runs."""
    folder = tmp_path / "step-00000002"
    shutil.copytree(runs / "sharded" / "checkpoints" / "step-00000002", folder)
    assert sharded.read_metadata(folder).state_dict_metadata  # DCP's own records: admitted
    (folder / ".metadata").write_bytes(pickle.dumps(Boom()))
    digests = json.loads((folder / DIGESTS).read_text())
    digests["files"][".metadata"] = file_digest(folder / ".metadata")
    (folder / DIGESTS).write_text(json.dumps(digests))
    problem = sharded_checkpoint_problem(folder)
    assert "refused global builtins.print" in problem, problem
    assert "this ran" not in capsys.readouterr().out


def test_a_sharded_checkpoint_exports_exactly(runs, tmp_path):
    pytest.importorskip("transformers")
    from cramlm.cli.export import export_run

    export_run(str(runs / "sharded" / "checkpoints" / "step-00000004"), str(tmp_path / "from-shards"))
    export_run(str(runs / "sharded"), str(tmp_path / "from-run"))
    export_run(str(runs / "full" / "checkpoints" / "step-00000004"), str(tmp_path / "from-full"))
    a, b, c = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("from-shards", "from-run", "from-full"))
    assert a.keys() == b.keys() == c.keys() and all(torch.equal(a[k], b[k]) and torch.equal(a[k], c[k]) for k in a)
    export_run(str(runs / "sharded" / "checkpoints" / "step-00000002"), str(tmp_path / "from-step-2"))
    d = load_file(str(tmp_path / "from-step-2" / "model.safetensors"))
    assert not all(torch.equal(a[k], d[k]) for k in a)  # another checkpoint, other weights


def test_a_sharded_checkpoint_is_evaluated_as_its_whole_twin(runs):
    """`cramlm eval checkpoint=<run>/checkpoints/step-N` on a sharded checkpoint: its weights read into memory
    (nothing written but the results); the held-out loss that of the full-format checkpoint and the run."""
    from click.testing import CliRunner

    from cramlm.cli import main

    def heldout(spec, stem: str) -> float:
        got = CliRunner().invoke(main, ["eval", f"checkpoint={spec}", "eval.tasks=[]", "impl.progress=false",
                                        "impl.threads=1", "impl.precision=fp32"])
        assert got.exit_code == 0, got.output
        return json.loads((spec if stem == "eval" else spec.parent.parent).joinpath(f"{stem}.json").read_text())["heldout"]["loss"]

    step4 = "eval-step-00000004"
    run = heldout(runs / "full", "eval")
    assert heldout(runs / "full" / "checkpoints" / "step-00000004", step4) == run
    assert heldout(runs / "sharded" / "checkpoints" / "step-00000004", step4) == run
    assert heldout(runs / "sharded" / "checkpoints" / "step-00000002", "eval-step-00000002") != run
    assert not list((runs / "sharded").glob(".eval-*"))  # the lock removed, nothing assembled
