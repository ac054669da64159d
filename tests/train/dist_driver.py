"""Run several ``cramlm pretrain`` configs one after the other in the same processes (started by
torchrun), so one launch (one torch import per process) covers DDP, FSDP2 and a resume.
Each run's folder gets ``collated-rank<r>.json``: the stream positions process r collated.
Usage: python -m torch.distributed.run ... tests/train/dist_driver.py '<json list of override lists>'"""

import json
import sys
from pathlib import Path
from datetime import timedelta

import torch.distributed as dist

from cramlm.cli.common import resolve_or_exit
from cramlm.run.pretrain import pretrain
from cramlm.train.distributed import close_process_group

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.train.helpers import record_collated  # noqa: E402

if __name__ == "__main__":
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))  # shared by the runs (pretrain reuses it)
    for overrides in json.loads(sys.argv[1]):
        cfg, collated = resolve_or_exit("pretrain", overrides), []
        undo = record_collated(collated)
        pretrain(cfg)
        undo()
        (cfg.run_dir / f"collated-rank{dist.get_rank()}.json").write_text(json.dumps(collated))
    close_process_group()
