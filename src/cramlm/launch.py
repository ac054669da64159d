"""``python -m cramlm.launch``: torchrun whose exit status tells preemption from failure.

    python -m cramlm.launch --nproc_per_node 2 -m cramlm pretrain ... --resume auto

takes torchrun's arguments unchanged and runs torchrun (``torch.distributed.run``) with them. On
SIGTERM or SIGINT torchrun passes the signal on to its workers, which finish their step, checkpoint
and exit 75 (train/preemption.py), but torchrun itself then ends with ``SignalException`` and exit
status 1, the same as a crash. This wrapper passes SIGTERM and SIGINT on to torchrun (SIGUSR1, which
torchrun does not handle, as SIGTERM), and each worker started with ``-m cramlm`` records its own
exit status in a temporary folder (``CRAMLM_LAUNCH_EXIT_DIR``, removed afterwards). The wrapper
exits with

- 75 when every worker of the last attempt recorded 75 (stopped on a signal after its checkpoint:
  a job script requeues and resumes),
- otherwise torchrun's own status (0 when the run finished, non-zero on a failure).

When every worker of the last attempt recorded its own exit, each has already said why it stopped (its
``Error:`` line, or that it checkpointed on a signal), so torchrun's closing traceback
(``ChildFailedError``'s report, or ``SignalException`` after a stop signal) is replaced by one line
naming each rank's status; so also where a worker failed with its own reason and torchrun then
stopped the others (SIGTERM) before they had one. A worker that did not record otherwise (killed,
or a crash past cramlm's own exit) keeps torchrun's report, which is then the only account of it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

EXIT_DIR_ENV = "CRAMLM_LAUNCH_EXIT_DIR"
EXIT_INTERRUPTED = 75  # train/preemption.py's (not imported: this module stays torch- and config-free)
FORWARDED = ("SIGTERM", "SIGINT", "SIGUSR1")


def record_exit(code: object) -> None:
    """In a worker under ``cramlm.launch``: write this process's exit status where the wrapper reads
    it (nothing outside a launch)."""
    folder = os.environ.get(EXIT_DIR_ENV)
    if not folder:
        return
    status = code if isinstance(code, int) else 0 if code is None else 1
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    rank = os.environ.get("LOCAL_RANK", str(os.getpid()))
    local_world = os.environ.get("LOCAL_WORLD_SIZE", "1")
    try:
        Path(folder, f"{attempt:04d}-{rank}").write_text(f"{status} {local_world}\n")
    except OSError:  # the wrapper then reports torchrun's own status
        pass


def recorded(folder: Path) -> tuple[dict[str, int], int] | None:
    """(local rank -> exit status, workers per node) of what the last attempt's workers recorded so far."""
    records: dict[int, dict[str, tuple[int, int]]] = {}
    for path in folder.iterdir():
        try:
            attempt, rank = path.name.split("-", 1)
            status, world = (int(v) for v in path.read_text().split())
            records.setdefault(int(attempt), {})[rank] = (status, world)
        except (OSError, ValueError):
            return None
    if not records:
        return None
    last = records[max(records)]
    return {rank: status for rank, (status, _) in _by_rank(last)}, next(iter(last.values()))[1]


def _by_rank(records: dict[str, object]) -> list[tuple[str, object]]:
    """Items keyed by local rank (text), in rank order (2 before 10)."""
    return sorted(records.items(), key=lambda kv: (len(kv[0]), kv[0]))


def last_attempt(folder: Path) -> dict[str, int] | None:
    """Local rank -> exit status of every worker of the last attempt, or None unless all of them recorded."""
    got = recorded(folder)
    return got[0] if got is not None and len(got[0]) == got[1] else None


def workers_interrupted(folder: Path) -> bool:
    """Whether every worker of the last attempt recorded 75 (and all of them recorded)."""
    statuses = last_attempt(folder)
    return bool(statuses) and all(status == EXIT_INTERRUPTED for status in statuses.values())


def torchrun(args: list[str]) -> None:
    """torchrun itself (in the wrapper's child process), its closing traceback replaced by one line
    where every worker recorded its own exit."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    try:
        torchrun_main(args)
    except (ChildFailedError, SignalException) as e:
        got = recorded(Path(os.environ[EXIT_DIR_ENV]))
        if got is None:
            raise
        statuses, world = got
        said = {rank: f"exit {status}" for rank, status in statuses.items()}
        if isinstance(e, ChildFailedError) and any(s not in (0, EXIT_INTERRUPTED) for s in statuses.values()):
            # the others, torn down by torchrun (SIGTERM) once a worker failed, had nothing to say
            for failure in e.failures.values():
                if str(failure.local_rank) not in said and failure.exitcode == -signal.SIGTERM:
                    said[str(failure.local_rank)] = "stopped by torchrun"
        if len(said) != world:  # a worker gave no reason of its own: torchrun's report is the only account
            raise
        ranks = ", ".join(f"local rank {rank}: {what}" for rank, what in _by_rank(said))
        why = "on a stop signal" if isinstance(e, SignalException) else "as a worker failed"
        print(f"cramlm.launch: torchrun stopped {why}; each worker's reason is above ({ranks})", file=sys.stderr, flush=True)
        sys.exit(1)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if args else 2
    with tempfile.TemporaryDirectory(prefix="cramlm-launch-") as folder:
        proc = subprocess.Popen([sys.executable, "-c", "import sys; from cramlm.launch import torchrun; torchrun(sys.argv[1:])", *args],
                                env={**os.environ, EXIT_DIR_ENV: folder})

        def forward(signum: int, frame) -> None:
            proc.send_signal(signal.SIGTERM if signum == getattr(signal, "SIGUSR1", None) else signum)

        for name in FORWARDED:
            if hasattr(signal, name):
                signal.signal(getattr(signal, name), forward)
        rc = proc.wait()
        for name in FORWARDED:  # the workers are gone: from here the signals act as usual
            if hasattr(signal, name):
                signal.signal(getattr(signal, name), signal.SIG_DFL)
        if rc != 0 and workers_interrupted(Path(folder)):
            print(f"cramlm.launch: every worker stopped on a signal after checkpointing (exit {EXIT_INTERRUPTED}); "
                  f"torchrun's own status was {rc}; resume with --resume auto", file=sys.stderr, flush=True)
            return EXIT_INTERRUPTED
    return rc


if __name__ == "__main__":
    sys.exit(main())
