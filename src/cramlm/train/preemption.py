"""Stopping a run on request without losing work: SIGINT (Ctrl-C), SIGTERM (Slurm preemption,
``kill``, torchrun passing on its own SIGTERM) and SIGUSR1 (Slurm's ``--signal``).

While the training loop runs, these signals only set a flag; the loop finishes the current step,
agrees on the flag with the other processes (it rides on the step's one reduction, so every rank
stops after the same step), writes a checkpoint, records an ``interrupted`` event in
metrics.jsonl and the process exits with status ``EXIT_INTERRUPTED`` (75, ``EX_TEMPFAIL`` of
sysexits.h: "try again later"); ``resume=auto`` continues the run. Ctrl-C pressed again (more than
two seconds after the first: a terminal and torchrun deliver the same Ctrl-C twice) stops at once.
"""

from __future__ import annotations

import signal
import threading
import time

EXIT_INTERRUPTED = 75
SIGNALS = ("SIGINT", "SIGTERM", "SIGUSR1")
_REPEAT_SECONDS = 2.0


class Interrupted(SystemExit):
    """The run stopped on a signal after checkpointing; exits the process with status 75."""

    def __init__(self, signame: str, step: int, checkpoint):
        super().__init__(EXIT_INTERRUPTED)
        self.signame, self.step, self.checkpoint = signame, step, checkpoint

    def __str__(self) -> str:
        return f"{self.signame}: stopped after step {self.step}, checkpoint {self.checkpoint}"


class StopRequest:
    """A context manager: inside it the signals above set ``signal`` (the number of the last one,
    0 when none) instead of ending the process. Handlers are only installed from the main thread
    (elsewhere Python does not allow it; the flag then stays 0)."""

    def __init__(self):
        self.signal = 0
        self._old: dict = {}
        self._first_at = 0.0

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for name in SIGNALS:
                sig = getattr(signal, name, None)  # no SIGUSR1 on Windows
                if sig is not None:
                    self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)
        self._old = {}

    def _handle(self, signum: int, frame) -> None:
        now = time.monotonic()
        if signum == signal.SIGINT and self.signal and now - self._first_at > _REPEAT_SECONDS:
            raise KeyboardInterrupt  # Ctrl-C again: stop now
        if not self.signal:
            self._first_at = now
        self.signal = self.signal or signum  # printing here could re-enter a write: the loop reports it



def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
