"""run_pinned (pipeline/pinned.py): commands side by side, each on a core of its own, for real
(taskset, subprocesses)."""

import json
import sys

import pytest

from cramlm.pipeline.pinned import run_pinned

AFFINITY = "import json, os, sys; json.dump(sorted(os.sched_getaffinity(0)), open(sys.argv[1], 'w'))"


def test_every_command_runs_pinned_to_one_core(tmp_path):
    out = [tmp_path / f"{i}.json" for i in range(3)]
    run_pinned([[sys.executable, "-c", AFFINITY, str(o)] for o in out], poll_seconds=0.05)
    cores = [json.loads(o.read_text()) for o in out]
    assert all(c in ([0], [1]) for c in cores) and cores[0] != cores[1]  # the first two side by side


def test_a_failing_command_ends_the_program_naming_it(tmp_path):
    ok = tmp_path / "ok.json"
    with pytest.raises(SystemExit, match=r"^failed \(3\): taskset -c \d .*exit\(3\)"):
        run_pinned([[sys.executable, "-c", "import sys; sys.exit(3)"], [sys.executable, "-c", AFFINITY, str(ok)]],
                   poll_seconds=0.05)
