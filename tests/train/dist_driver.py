"""Run several ``cramlm pretrain`` configs one after the other in the same processes (started by
torchrun), so one launch (one torch import per process) covers DDP, FSDP2 and a resume.
Usage: python -m torch.distributed.run ... tests/train/dist_driver.py '<json list of override lists>'"""

import json
import sys
from datetime import timedelta

import torch.distributed as dist

from cramlm.cli.common import resolve_or_exit
from cramlm.pretrain import pretrain
from cramlm.train.distributed import close_process_group

if __name__ == "__main__":
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))  # shared by the runs (pretrain reuses it)
    for overrides in json.loads(sys.argv[1]):
        pretrain(resolve_or_exit("pretrain", overrides))
    close_process_group()
