"""Metric sinks of a run: ``metrics.jsonl`` always (one JSON line per record); TensorBoard and
Weights & Biases when ``impl.tensorboard`` / ``impl.wandb`` ask for them."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from cramlm.io import is_disk_full

HELD_LINES = 1_000_000  # lines kept in memory while the disk is full (~400 MB at most); older ones beyond are dropped, counted


def _ends_torn(path: Path) -> bool:
    """Whether the file's last line lacks its newline (a kill mid-write)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            if f.tell() == 0:
                return False
            f.seek(-1, 2)
            return f.read(1) != b"\n"
    except OSError:
        return False


def wall_clock() -> str:
    """Now, UTC, to the second (ISO 8601): the time a segment or event line was written."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class MetricsLog:
    """One JSON line per record in ``metrics.jsonl``; optionally TensorBoard and W&B.

    A full disk does not stop training (as a checkpoint that cannot be written does not): the lines
    are held in memory and written once there is space again, the file cut back to its last whole
    line meanwhile; one warning says so, another when they are written."""

    def __init__(self, run_dir: Path, impl, config: dict, enabled: bool = True, append: bool = False):
        self.enabled = enabled
        self.file = self.tb = self.wandb = None
        self.held: list[bytes] = []  # lines not yet on disk (a full disk)
        self.dropped = 0  # lines beyond HELD_LINES, lost
        self.full = False  # the last write found the disk full
        if not enabled:
            return
        self.path = run_dir / "metrics.jsonl"
        torn = append and _ends_torn(self.path)
        self.file = open(self.path, "ab" if append else "wb", buffering=0)  # each line straight to the OS: no half-flushed buffer
        self.whole = self.file.tell()  # the size up to its last whole line
        if torn:  # a line cut by a kill mid-write: the next record starts on a line of its own
            self.held.append(b"\n")
        if impl.tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # needs the `tensorboard` package

            # event files in the run folder itself: `tensorboard --logdir outputs` lists the run by its name
            self.tb = SummaryWriter(str(run_dir))
        if impl.wandb:
            import wandb  # optional extra: pip install cramlm[wandb]

            self.wandb = wandb.init(
                project=impl.wandb_project, name=run_dir.name, dir=str(run_dir), mode=impl.wandb_mode,
                config=config, resume="allow", id=run_dir.name,
            )

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        self.held.append((json.dumps(record) + "\n").encode("utf-8"))
        self._write_held()
        if record.get("kind") in ("segment", "finished"):  # which ran where: not metrics
            return
        step = record.get("step", 0)
        scalars = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "step"}
        if self.tb:
            with self._sink("tb", "TensorBoard's event file"):
                for key, value in scalars.items():
                    self.tb.add_scalar(f"{record.get('kind', 'train')}/{key}", value, step)
        if self.wandb:
            with self._sink("wandb", "W&B's run files"):
                self.wandb.log({f"{record.get('kind', 'train')}/{k}": v for k, v in scalars.items()}, step=step)

    @contextmanager
    def _sink(self, name: str, what: str) -> Iterator[None]:
        """A full disk under TensorBoard or W&B (whose writers stay broken once it happened): that sink
        is dropped with a warning, training goes on, metrics.jsonl keeps every line."""
        try:
            yield
        except Exception as e:
            if not is_disk_full(e):
                raise
            setattr(self, name, None)
            _say(f"cramlm: warning: disk full while writing {what}: it stops here; metrics.jsonl holds every line; training goes on")

    def _write_held(self) -> None:
        """The held lines, oldest first, as many as there is space for."""
        written = 0
        try:
            for line in self.held:
                done = 0
                while done < len(line):
                    done += self.file.write(line[done:])
                self.whole += len(line)
                written += 1
        except OSError as e:
            del self.held[:written]
            if not is_disk_full(e):
                raise
            os.ftruncate(self.file.fileno(), self.whole)  # no torn line in the file meanwhile
            self.file.seek(self.whole)  # ("wb": the next write goes where the torn line began)
            if not self.full:
                self.full = True
                _say(f"cramlm: warning: disk full while writing {self.path}: its lines are held in memory and written "
                     "when there is space again; training goes on")
            if len(self.held) > HELD_LINES:
                ends_torn_line = self.held[0] == b"\n"  # the newline after a torn last line stays first
                self.dropped += len(self.held) - HELD_LINES
                del self.held[:-HELD_LINES]
                if ends_torn_line:
                    self.held.insert(0, b"\n")
            return
        self.held.clear()
        if self.full:
            self.full = False
            _say(f"cramlm: {self.path}: the lines held while the disk was full are written"
                 + (f"; {self.dropped:,} older ones were lost" if self.dropped else ""))
            self.dropped = 0

    def close(self) -> None:
        if self.file:
            if self.held:
                self._write_held()  # space may have freed since the last line
            if self.held:
                _say(f"cramlm: warning: {self.path}: {len(self.held):,} lines could not be written (disk full)")
            self.file.close()
        if self.tb:
            with self._sink("tb", "TensorBoard's event file"):
                self.tb.close()
        if self.wandb:
            with self._sink("wandb", "W&B's run files"):
                self.wandb.finish()


def _say(message: str) -> None:
    """A warning on stderr; one that cannot be printed (stderr redirected to the full disk) is dropped,
    not raised into the training loop."""
    try:
        print(message, file=sys.stderr)
    except OSError:
        pass
