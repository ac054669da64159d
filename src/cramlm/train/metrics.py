"""Metric sinks of a run: ``metrics.jsonl`` always (one JSON line per record); TensorBoard and
Weights & Biases when ``impl.tensorboard`` / ``impl.wandb`` ask for them."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path


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
    """One JSON line per record in ``metrics.jsonl``; optionally TensorBoard and W&B."""

    def __init__(self, run_dir: Path, impl, config: dict, enabled: bool = True, append: bool = False):
        self.enabled = enabled
        self.file = self.tb = self.wandb = None
        if not enabled:
            return
        path = run_dir / "metrics.jsonl"
        torn = append and _ends_torn(path)
        self.file = open(path, "a" if append else "w", encoding="utf-8")
        if torn:  # a line cut by a kill mid-write: the next record starts on a line of its own
            self.file.write("\n")
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
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        if record.get("kind") in ("segment", "finished"):  # which ran where: not metrics
            return
        step = record.get("step", 0)
        scalars = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "step"}
        if self.tb:
            for key, value in scalars.items():
                self.tb.add_scalar(f"{record.get('kind', 'train')}/{key}", value, step)
        if self.wandb:
            self.wandb.log({f"{record.get('kind', 'train')}/{k}": v for k, v in scalars.items()}, step=step)

    def close(self) -> None:
        if self.file:
            self.file.close()
        if self.tb:
            self.tb.close()
        if self.wandb:
            self.wandb.finish()
