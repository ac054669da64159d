"""Training batches: each process draws and collates only the sequences of its own microbatches.

An optimizer step covers the next ``n_micro * m`` positions of the shuffled stream, one global
sequence (``data.dataset.ShuffledStream``): microbatch j of a step starting at position s holds
positions ``s + j*m ... s + (j+1)*m - 1``, and process r of ``world`` trains microbatches
``r, r + world, r + 2*world, ...``. Masks are keyed by stream position (``data.collate``), so a sequence is the same tensor whichever
process collates it: N processes train on exactly the batches of one process, each doing 1/N of
the host work, and a checkpoint resumes on any number of processes.

The data state a checkpoint holds (``StepData.state_dict``) is of data format 2: the stream position.
Format 1 (no ``format`` in the data state: every process drew and masked the whole global batch,
masks from the collator's generator in draw order) is refused at resume (``data_state_problem``):
this cramlm cannot continue such a run bit for bit.

``LocalBatches`` hands the trainer this process's microbatches of a step, on the device,
optionally prepared a step ahead by a background thread (``impl.prefetch``), and counts the host
time the loop spent getting them (the exposed host time of ``metrics.jsonl``).
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from cramlm.data.dataset import ShuffledStream

DATA_FORMAT = 2  # rank-local microbatches, masks keyed by stream position (1, no field: global batches, refused)
_RESTART = "this cramlm cannot continue it bit for bit: start the run fresh (or resume with the cramlm that wrote it)"


class DataFormatError(ValueError):
    """A checkpoint's data state is of a format this cramlm does not read."""


def data_state_problem(state: dict) -> str | None:
    """Why this cramlm cannot continue a checkpoint's data state (``StepData.state_dict``), or None."""
    if "format" not in state:
        return ("its data state is format 1 (written by cramlm before masks were keyed by stream position); "
                + _RESTART)
    if state.get("masks") == "sequential":  # format 2 as a run resumed from format 1 wrote it
        return ("its data state continues a format-1 run (masks drawn in sequence by the collator, not keyed by "
                "stream position); " + _RESTART)
    version = state["format"]
    if version != DATA_FORMAT:
        newer = "newer than" if isinstance(version, int) and version > DATA_FORMAT else "not the format"
        return (f"its data state has format {version}, {newer} this cramlm reads ({DATA_FORMAT}): "
                "resume it with the cramlm version that wrote it")
    return None


class StepData:
    """The shuffled stream, its dataset and collator. ``take(n)``: the next n sequences, collated
    (one process: tests, the planner); ``local_positions``/``sequences``: what the trainer uses.
    State: the stream position.
    ``documents=True`` (train.document_attention): blocks carry ``document_ids`` and
    ``position_ids`` (``dataset.batch_with_boundaries``), so the model keeps documents apart."""

    def __init__(self, dataset, collate, seed: int, documents: bool = False):
        self.dataset = dataset
        self.collate = collate
        self.order = ShuffledStream(len(dataset), seed)
        self.seq_len = getattr(dataset, "seq_length", None) or len(dataset.batch([0])[0])
        self.draw = dataset.batch_with_boundaries if documents else dataset.batch
        self.positional = _takes_positions(collate)  # masks keyed by position (else: no randomness)

    def sequences(self, positions: np.ndarray) -> dict[str, torch.Tensor]:
        """The sequences at these stream positions, collated: a pure function of the positions."""
        batch = self.draw(self.order.at(positions))
        return self.collate(batch, positions) if self.positional else self.collate(batch)

    def local_positions(self, n_micro: int, m: int, rank: int = 0, world: int = 1) -> np.ndarray:
        """Stream positions of this process's microbatches of the next step, microbatch after
        microbatch (strided: r, r + world, ...); moves the stream past the whole step, as on every
        process."""
        s = self.order.step
        self.order.skip(n_micro * m)
        return _positions(s, n_micro, m, rank, world)

    def take(self, n: int) -> dict[str, torch.Tensor]:
        """The next n sequences, collated."""
        s = self.order.step
        self.order.skip(n)
        return self.sequences(s + np.arange(n, dtype=np.int64))

    def state_dict(self) -> dict:
        return {"format": DATA_FORMAT, "stream": self.order.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if problem := data_state_problem(state):
            raise DataFormatError(problem)
        self.order.load_state_dict(state["stream"])


def _positions(s: int, n_micro: int, m: int, rank: int, world: int) -> np.ndarray:
    starts = s + m * np.arange(rank, n_micro, world, dtype=np.int64)
    return (starts[:, None] + np.arange(m, dtype=np.int64)).reshape(-1)


def _takes_positions(collate) -> bool:
    import inspect

    try:
        return "positions" in inspect.signature(collate).parameters
    except (TypeError, ValueError):
        return False


class LocalBatches:
    """This process's microbatches of each step, moved to ``device``: the step's sequences are drawn
    and collated in one go (one call's fixed costs per step), then cut into
    microbatches. ``prefetch``: from the moment the last microbatch's backward is issued, a
    background thread prepares the next step's batch (drawn, collated, pinned on CUDA) while the
    device computes, guessing that it has as many microbatches as this one (true except during a
    batch ramp). Keyed batches are pure functions of their stream positions, so a prepared batch
    is used exactly when its positions are the ones needed; a wrong guess (a ramp, a resume) is
    simply redone. ``host_seconds`` adds up the wall time the loop spent here (waiting for the
    thread when it prefetches) and ``host_cpu_seconds`` the training thread's CPU time (what
    benchmarks/scaling.py compares, since processes that share cores also wait for them)."""

    def __init__(self, data: StepData, m: int, rank: int, world: int, device: torch.device, prefetch: bool = False):
        self.data, self.m, self.rank, self.world, self.device = data, m, rank, world, device
        self.pin = device.type == "cuda"
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="cramlm-prefetch") if prefetch else None
        self.pending: tuple[np.ndarray, Future] | None = None
        self.host_seconds = self.host_cpu_seconds = 0.0

    def step(self, n_micro: int):
        """Yield this process's microbatches of the next step (n_micro microbatches over all processes)."""
        clock = self._clock()
        positions = self.data.local_positions(n_micro, self.m, self.rank, self.world)
        batch = self._get(positions)
        self._count(clock)
        m = self.m
        for j in range(len(positions) // m):
            clock = self._clock()
            micro = {k: v[j * m : (j + 1) * m].to(self.device, non_blocking=True) for k, v in batch.items()}
            self._count(clock)
            yield micro
        if self.pool is not None:
            # the next step, if it is as large as this one. Submitted once the last microbatch's
            # backward has been issued: the thread then mostly runs while this one waits in C++ (the
            # step's reduction, the optimizer step), not while it dispatches the forward, since the
            # two share the GIL (a waiting thread can lose up to the 5 ms switch interval per handoff)
            after = _positions(self.data.order.step, n_micro, self.m, self.rank, self.world)
            self.pending = (after, self.pool.submit(self._prepare, after))

    def wait_prefetch(self) -> None:
        """Wait until the next step's batch, if one is being prepared, is ready (a benchmark that times
        steps one by one counts that work in the step that started it)."""
        if self.pending is not None:
            self.pending[1].result()

    def _prepare(self, positions: np.ndarray) -> dict[str, torch.Tensor]:
        return self._ready(self.data.sequences(positions))

    def _ready(self, batch: dict) -> dict:
        return {k: v.pin_memory() for k, v in batch.items()} if self.pin else batch

    def _get(self, positions: np.ndarray) -> dict[str, torch.Tensor]:
        pending, self.pending = self.pending, None
        if pending is not None:
            batch = pending[1].result()  # (also when it is not the one: the thread is free again)
            if np.array_equal(pending[0], positions):
                return batch
        return self._prepare(positions)

    def _clock(self) -> tuple[float, float]:
        return time.perf_counter(), time.thread_time()

    def _count(self, clock: tuple[float, float]) -> None:
        self.host_seconds += time.perf_counter() - clock[0]
        self.host_cpu_seconds += time.thread_time() - clock[1]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool, self.pending = None, None
