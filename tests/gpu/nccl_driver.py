"""Run by tests/gpu/test_nccl.py as a one-process job (RANK=0, WORLD_SIZE=1 in the env): cramlm's
own init_distributed on a GPU must give an NCCL group bound to the device; a collective and a
barrier run through it; compile=auto leaves a DDP-wrapped model alone; then a DDP and an FSDP2
`cramlm pretrain` reuse the group. Prints what it saw as JSON (last line).
Usage: python tests/gpu/nccl_driver.py <tmp dir> <override>..."""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from cramlm.train.distributed import all_reduce, barrier, close_process_group, init_distributed  # noqa: E402
from cramlm.train.impl import ImplConfig  # noqa: E402
from cramlm.train.parallelize import compile_model  # noqa: E402
from tests.train.helpers import run_inprocess  # noqa: E402

if __name__ == "__main__":
    tmp, extra = Path(sys.argv[1]), sys.argv[2:]
    d = init_distributed(ImplConfig(distributed="ddp", dist_timeout=60))
    seen = {"backend": dist.get_backend(), "world": d.world, "rank": d.rank, "owns_group": d.owns_group,
            "sum": all_reduce([1.5, 2.0], d, "sum", torch.device("cuda")),
            "max": all_reduce([3.0], d, "max", torch.device("cuda"))}
    barrier(d)
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4).cuda(), device_ids=[0])
    seen["compile_auto_wraps_ddp"] = compile_model(ddp, ImplConfig()) is not ddp
    summary = run_inprocess(tmp, "ddp", *extra, "impl.distributed=ddp")
    seen["summary_world_size"] = summary["world_size"]
    # FSDP2 on the group: the model is built on the host and each block moves as it is sharded
    seen["fsdp_world_size"] = run_inprocess(tmp, "fsdp", *extra, "impl.distributed=fsdp")["world_size"]
    close_process_group()
    print(json.dumps(seen))
