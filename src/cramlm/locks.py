"""Exclusive locks on folders cramlm writes (a run folder, a data-cache entry), one mechanism for all.

A lock is ``filelock.FileLock`` (``flock`` on Unix): the kernel releases it when its process dies,
even by SIGKILL, so a lock left by a killed run never needs to be removed by hand. Machines that
share a file system share its locks where it honours ``flock`` across clients (NFS does by default,
through its byte-range locks; Lustre when mounted with ``-o flock``; neither with a local-only option,
``local_lock=flock`` / ``localflock``, where each machine sees only its own). Beside the lock
file, ``<lock>.owner`` records who holds it (pid, host, since when, the command) so that a refused
process can say who is in the way.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

from filelock import FileLock, Timeout

from cramlm.io import write_json


class LockHeld(RuntimeError):
    """Another process holds the lock; the message names it (pid, host) and the lock file."""


def owner_file(lock: Path) -> Path:
    return lock.with_name(lock.name + ".owner")


def describe_owner(lock: Path) -> str:
    """'pid 123 on host-a since 2025-01-01 12:00:00 (cramlm pretrain name=x)', as far as known."""
    try:
        info = json.loads(owner_file(lock).read_text(encoding="utf-8"))
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["since"]))
        return f"pid {info['pid']} on {info['host']} since {since} ({info['command']})"
    except (OSError, ValueError, KeyError, TypeError):  # the holder has not written it yet
        return "another process (its pid is not recorded yet)"


class FolderLock:
    """``with FolderLock(path, what):`` holds ``path`` (a lock file) or raises LockHeld after
    waiting ``timeout`` seconds (0: refuse at once; None: wait for as long as it takes)."""

    def __init__(self, path: str | Path, what: str, timeout: float | None = 0):
        self.path, self.what, self.timeout = Path(path), what, timeout
        self._lock = FileLock(str(self.path))

    def acquire(self) -> FolderLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._lock.acquire(timeout=-1 if self.timeout is None else self.timeout, poll_interval=0.2)
        except Timeout:
            raise LockHeld(f"{self.what} is in use by {describe_owner(self.path)}; lock file {self.path}") from None
        info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(), "command": _command()}
        write_json(owner_file(self.path), info, indent=None)
        return self

    def release(self) -> None:
        if self._lock.is_locked:
            owner_file(self.path).unlink(missing_ok=True)  # ours while we hold the lock
            self._lock.release()

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _command() -> str:
    program = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path("python")
    name = program.parent.name if program.name == "__main__.py" else program.name  # python -m cramlm: "cramlm"
    args = [name, *sys.argv[1:]]
    text = " ".join(args)
    return text if len(text) <= 200 else text[:197] + "..."
