"""One progress bar for every stage: live on a terminal, sparse in a log file.

On a terminal tqdm redraws in place; redirected to a file (nohup, CI, a cluster's job log) every
redraw is a new line, so a 5,000-step fine-tuning run wrote 10,000 of them. Off a terminal the bar
redraws at most every 30 s instead.
"""

from __future__ import annotations

import sys

from tqdm import tqdm

LOG_FILE_INTERVAL_S = 30.0


def progress_bar(*, enabled: bool = True, **kwargs) -> tqdm:
    """A tqdm bar; `enabled=False` gives a silent one. Keyword arguments go to tqdm."""
    stream = kwargs.get("file") or sys.stderr
    interactive = hasattr(stream, "isatty") and stream.isatty()
    kwargs.setdefault("mininterval", 0.1 if interactive else LOG_FILE_INTERVAL_S)
    kwargs.setdefault("dynamic_ncols", interactive)
    return tqdm(disable=not enabled, **kwargs)
