"""Run by tests/gpu/test_checkpoint.py in a fresh process (cuBLAS reads CUBLAS_WORKSPACE_CONFIG
when it starts): under torch.use_deterministic_algorithms(warn_only=True), an 8-step run with a
checkpoint after every step, then a second run resumed from its step-4 checkpoint. Prints the
warnings of operations that have no deterministic implementation (as JSON, last line).
Usage: python tests/gpu/resume_driver.py <tmp dir> <override>..."""

import json
import shutil
import sys
import warnings
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.train.helpers import run_inprocess  # noqa: E402

if __name__ == "__main__":
    tmp, extra = Path(sys.argv[1]), sys.argv[2:]
    torch.use_deterministic_algorithms(True, warn_only=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_inprocess(tmp, "ref", *extra)
        shutil.copytree(tmp / "ref" / "checkpoints" / "step-00000004", tmp / "resumed" / "checkpoints" / "step-00000004")
        run_inprocess(tmp, "resumed", *extra, "resume=auto")
    nondeterministic = sorted({str(w.message).split("\n")[0] for w in caught
                               if "deterministic" in str(w.message) and "implementation" in str(w.message)})
    print(json.dumps({"nondeterministic": nondeterministic}))
