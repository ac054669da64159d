"""Run by tests/gpu/test_nccl.py as a one-process job (RANK=0, WORLD_SIZE=1 in the env): an FSDP2
run on cramlm's own process group (NCCL on a GPU) writes sharded checkpoints from device tensors;
its step-2 checkpoint alone (a kill after step 2) resumes under FSDP2 on the same group. Prints
what it saw as JSON (last line).
Usage: python tests/gpu/sharded_driver.py <tmp dir> <override>..."""

import json
import shutil
import sys
from pathlib import Path

import torch.distributed as dist

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from cramlm.train.distributed import close_process_group, init_distributed  # noqa: E402
from cramlm.train.impl import ImplConfig  # noqa: E402
from tests.train.helpers import run_inprocess  # noqa: E402

if __name__ == "__main__":
    tmp, extra = Path(sys.argv[1]), sys.argv[2:]
    init_distributed(ImplConfig(distributed="fsdp", dist_timeout=60))
    seen = {"backend": dist.get_backend()}
    run_inprocess(tmp, "fsdp", *extra, "impl.distributed=fsdp")
    step2 = tmp / "fsdp" / "checkpoints" / "step-00000002"
    seen["files"] = sorted(p.name for p in step2.iterdir())
    for name in ("fsdp-again", "to-one"):
        shutil.copytree(step2, tmp / name / "checkpoints" / step2.name)
    run_inprocess(tmp, "fsdp-again", *extra, "impl.distributed=fsdp", "resume=auto")
    close_process_group()
    print(json.dumps(seen))
