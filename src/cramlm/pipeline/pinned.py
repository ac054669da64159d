"""Commands side by side, each pinned to a core of its own (``taskset``): how two trainings share a
2-core machine without one taking the other's core, as the recipe comparisons, ablations and
planner grids of benchmarks/ run them (each run with ``impl.threads=1``)."""

from __future__ import annotations

import shlex
import subprocess
import sys
import time


def run_pinned(cmds: list[list[str]], running: dict | None = None, cores: tuple[int, ...] = (0, 1),
               poll_seconds: float = 2.0) -> None:
    """Run ``cmds`` in order, each pinned to a free core of ``cores``, the next as soon as one is
    free; ``running``: {core: Popen} already started there (waited for like the others). A command
    that fails ends the program (``SystemExit`` naming it and its status) once it is seen."""
    pending, running = list(cmds), dict(running or {})
    while pending or running:
        for core in cores:
            if core not in running and pending:
                cmd = ["taskset", "-c", str(core), *pending.pop(0)]
                print("+", shlex.join(cmd), flush=True)
                running[core] = subprocess.Popen(cmd)
        time.sleep(poll_seconds)
        for core, proc in list(running.items()):
            if proc.poll() is not None:
                if proc.returncode:
                    sys.exit(f"failed ({proc.returncode}): {shlex.join(proc.args)}")
                del running[core]
