"""Rank-local batches (train/batches.py): a process collates only its own microbatches, masks keyed by
stream position make them equal to one process's, a data state of another format is refused, and
the prefetcher changes nothing but when the work is done."""

import numpy as np
import pytest
import torch

from cramlm.data.collate import MLMCollator
from cramlm.train.batches import DataFormatError, LocalBatches, StepData

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


def mlm_data(seed: int = 3) -> StepData:
    return StepData(Blocks(), MLMCollator(VOCAB, mask_id=4, num_special=5, mlm_probability=0.3, seed=seed), seed)


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
    alone = collate(ids)  # a batch on its own (a sample): keyed as the stream's first sequences
    assert torch.equal(alone["labels"], collate(ids, positions=[0, 1, 2, 3])["labels"])


def test_a_data_state_resumes_the_stream_and_other_formats_are_refused():
    written = mlm_data()
    written.take(20)
    state = written.state_dict()
    assert state == {"format": 2, "stream": written.order.state_dict()}
    resumed = mlm_data()
    resumed.load_state_dict(state)
    expected, got = written.take(8), resumed.take(8)
    assert all(torch.equal(expected[k], got[k]) for k in expected)
    # format 1 (no format: the global batch masked by the collator's generator), a format-2 state of a
    # run resumed from format 1 (masks sequential), a newer format: each refused, nothing loaded
    generator = {"generator": torch.Generator().manual_seed(3).get_state()}
    for old, text in [({"stream": {"step": 20, "world_size": 1}, "collator": generator}, "its data state is format 1 "),
                      ({**state, "masks": "sequential", "collator": generator}, "continues a format-1 run"),
                      ({**state, "format": 3}, r"format 3, newer than this cramlm reads \(2\)")]:
        fresh = mlm_data()
        with pytest.raises(DataFormatError, match=text):
            fresh.load_state_dict(old)
        assert fresh.order.step == 0


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
        plain.wait_prefetch()  # nothing in flight: returns at once
        ahead.wait_prefetch()
        assert ahead.pending is not None and ahead.pending[1].done()
    finally:
        ahead.close()


STEPS = ["budget=null", "train.budget.steps=4", "train.checkpoint_every=2", "train.keep_checkpoints=5",
         "train.validate_every=0", "train.batch_size=8", "impl.microbatch_size=4"]


def test_prefetch_on_a_cpu_run_changes_nothing_but_is_logged(tmp_path):
    run_inprocess(tmp_path, "inline", *STEPS)
    run_inprocess(tmp_path, "prefetched", *STEPS, "impl.prefetch=true")
    assert losses(tmp_path / "prefetched") == losses(tmp_path / "inline")
    for name in ("inline", "prefetched"):
        host = [r["host_seconds"] for r in records(tmp_path / name)]
        assert len(host) == 4 and all(h > 0 for h in host), (name, host)
