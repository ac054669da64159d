"""Rank-local batches (train/batches.py): a process collates only its own microbatches, masks keyed by
stream position make them equal to one process's, older (format-1) data states resume on their own
path, and the prefetcher changes nothing but when the work is done."""

import shutil

import numpy as np
import pytest
import torch

from cramlm.data.collate import MLMCollator, causal_collate
from cramlm.train.batches import LocalBatches, StepData
from cramlm.io import CheckpointFileError, write_digests
from cramlm.train.checkpoint import checkpoint_dirs, latest_checkpoint

from .helpers import losses, records, run_inprocess

VOCAB, SEQ = 300, 16


class Blocks:
    seq_length = SEQ

    def __init__(self, n: int = 50):
        self.blocks = np.random.default_rng(0).integers(0, VOCAB, size=(n, SEQ))  # some special ids (< 5) too

    def __len__(self):
        return len(self.blocks)

    def batch(self, indices):
        return torch.from_numpy(self.blocks[np.asarray(indices)])


def mlm_data(keyed: bool = True, seed: int = 3) -> StepData:
    return StepData(Blocks(), MLMCollator(VOCAB, mask_id=4, num_special=5, mlm_probability=0.3, seed=seed), seed, keyed=keyed)


def by_position(data: StepData, n_micro: int, m: int, rank: int, world: int) -> dict[int, dict]:
    """This process's sequences of the next step, by stream position."""
    positions = data.local_positions(n_micro, m, rank, world)
    batch = data.sequences(positions)
    return {int(p): {k: v[i] for k, v in batch.items()} for i, p in enumerate(positions)}


def test_processes_collate_disjoint_shares_equal_to_one_process():
    n_micro, m, steps = 12, 3, 3  # 36 sequences a step: two epochs of 50 within three steps
    one = mlm_data()
    reference = [one.take(n_micro * m) for _ in range(steps)]
    for world in (1, 2, 3, 4):
        datas = [mlm_data() for _ in range(world)]  # one StepData per process, as in a real run
        for step in range(steps):
            shares = [by_position(d, n_micro, m, rank, world) for rank, d in enumerate(datas)]
            positions = [set(s) for s in shares]
            assert all(len(p) == n_micro * m // world for p in positions)
            assert len(set().union(*positions)) == sum(map(len, positions))  # disjoint
            first = step * n_micro * m
            assert set().union(*positions) == set(range(first, first + n_micro * m))
            merged = {k: v for s in shares for k, v in s.items()}
            for key in ("input_ids", "labels"):
                glued = torch.stack([merged[first + i][key] for i in range(n_micro * m)])
                assert torch.equal(glued, reference[step][key]), (world, step, key)
    assert (reference[0]["labels"] != -100).any() and (reference[0]["input_ids"] == 4).any()  # masked


def test_keyed_masks_depend_only_on_seed_and_position():
    ids = Blocks().batch(np.arange(4))
    collate = MLMCollator(VOCAB, 4, 5, 0.3, seed=3)
    a = collate(ids, positions=[7, 8, 9, 10])
    b = collate(ids[1:3], positions=[8, 9])  # the same sequences at the same positions, alone
    assert torch.equal(a["input_ids"][1:3], b["input_ids"]) and torch.equal(a["labels"][1:3], b["labels"])
    assert not torch.equal(collate(ids, positions=[0, 1, 2, 3])["labels"], a["labels"])  # another position
    assert not torch.equal(MLMCollator(VOCAB, 4, 5, 0.3, seed=4)(ids, positions=[7, 8, 9, 10])["labels"], a["labels"])
    with pytest.raises(ValueError, match="one stream position per sequence"):
        collate(ids, positions=[1, 2])


def test_data_states_of_format_1_and_newer_formats():
    old = mlm_data(keyed=False)
    old.take(20)
    state = old.state_dict()
    assert state["format"] == 2 and state["masks"] == "sequential" and state["collator"] is not None
    format_1 = {"stream": state["stream"], "collator": state["collator"]}  # what cramlm wrote before keyed masks
    resumed = mlm_data()
    resumed.load_state_dict(format_1)
    assert not resumed.keyed  # stays on the global-batch path: the same batches as the run that wrote it
    expected, got = old.take(8), resumed.take(8)
    assert all(torch.equal(expected[k], got[k]) for k in expected)
    assert mlm_data().take(8)["labels"].shape == expected["labels"].shape
    # a causal LM's format-1 state (no masks) moves to rank-local batches: they are the same batches
    causal = StepData(Blocks(), causal_collate, 3)
    causal.load_state_dict({"stream": {"step": 5, "world_size": 1}, "collator": None})
    assert causal.keyed and causal.order.step == 5
    keyed = mlm_data()
    keyed.load_state_dict(mlm_data().state_dict())
    assert keyed.keyed
    with pytest.raises(ValueError, match="format 3, newer than this cramlm reads"):
        mlm_data().load_state_dict({"format": 3, "stream": {"step": 0}})


def test_prefetched_batches_are_the_same_batches():
    plain = LocalBatches(mlm_data(), 2, rank=1, world=2, device=torch.device("cpu"))
    ahead = LocalBatches(mlm_data(), 2, rank=1, world=2, device=torch.device("cpu"), prefetch=True)
    try:
        for n_micro in (4, 2, 6, 6):  # steps of changing size (a batch ramp): the guesses miss now and then
            a, b = list(plain.step(n_micro)), list(ahead.step(n_micro))
            assert len(a) == len(b) == n_micro // 2
            assert all(torch.equal(x[k], y[k]) for x, y in zip(a, b) for k in x)
        ahead.data.order.load_state_dict({"step": 0})  # a rollback or resume: positions go back
        plain.data.order.load_state_dict({"step": 0})
        a, b = list(plain.step(4)), list(ahead.step(4))
        assert all(torch.equal(x[k], y[k]) for x, y in zip(a, b) for k in x)
        assert plain.host_seconds > 0 and ahead.host_seconds > 0
    finally:
        ahead.close()


STEPS = ["budget=null", "train.budget.steps=4", "train.checkpoint_every=2", "train.keep_checkpoints=5",
         "train.validate_every=0", "train.batch_size=8", "impl.microbatch_size=4"]


def test_a_format_1_checkpoint_resumes_on_its_path_bit_for_bit(tmp_path, monkeypatch):
    init = StepData.__init__
    with monkeypatch.context() as patch:  # the run as cramlm ran it before keyed masks
        patch.setattr(StepData, "__init__", lambda self, *a, **k: init(self, *a, **{**k, "keyed": False}))
        run_inprocess(tmp_path, "old", *STEPS)
    run_inprocess(tmp_path, "new", *STEPS)
    reference = losses(tmp_path / "old")
    assert losses(tmp_path / "new")[1] != reference[1]  # the masks did change (else this test proves nothing)
    # its step-2 checkpoint, with the data state as format 1 wrote it
    checkpoint = tmp_path / "old" / "checkpoints" / "step-00000002"
    training = torch.load(checkpoint / "training.pt", weights_only=True)
    training["data"] = {"stream": training["data"]["stream"], "collator": training["data"]["collator"]}
    target = tmp_path / "resumed" / "checkpoints" / "step-00000002"
    target.mkdir(parents=True)
    for f in checkpoint.iterdir():
        target.joinpath(f.name).write_bytes(f.read_bytes())
    torch.save(training, target / "training.pt")
    write_digests(target, ["training.pt"])  # as a checkpoint with that data state would record it
    run_inprocess(tmp_path, "resumed", *STEPS, "resume=auto")
    resumed = losses(tmp_path / "resumed")
    assert sorted(resumed) == [3, 4] and all(resumed[s] == reference[s] for s in (3, 4)), (resumed, reference)
    event = records(tmp_path / "resumed", "event")[0]
    assert event["event"] == "resumed" and event["data_format"] == 1 and event["masks"] == "sequential"
    # and the checkpoints it writes keep saying so, so a second resume stays on that path too
    again = torch.load(latest_checkpoint(tmp_path / "resumed" / "checkpoints") / "training.pt", weights_only=True)
    assert again["data"]["masks"] == "sequential" and again["data"]["format"] == 2
    # a data format newer than this cramlm reads: refused, naming the checkpoint, before any step
    training["data"] = {**mlm_data().state_dict(), "format": 3}
    torch.save(training, target / "training.pt")
    write_digests(target, ["training.pt"])
    for later in checkpoint_dirs(tmp_path / "resumed" / "checkpoints"):
        if later != target:
            shutil.rmtree(later)
    with pytest.raises(CheckpointFileError, match=r"resume from .*step-00000002: its data state has format 3, newer"):
        run_inprocess(tmp_path, "resumed", *STEPS, "resume=auto")


def test_prefetch_on_a_cpu_run_changes_nothing_but_is_logged(tmp_path):
    run_inprocess(tmp_path, "inline", *STEPS)
    run_inprocess(tmp_path, "prefetched", *STEPS, "impl.prefetch=true")
    assert losses(tmp_path / "prefetched") == losses(tmp_path / "inline")
    for name in ("inline", "prefetched"):
        host = [r["host_seconds"] for r in records(tmp_path / name)]
        assert len(host) == 4 and all(h > 0 for h in host), (name, host)
