"""Run reports: ``report.html`` (self-contained: plots embedded as base64 PNG) plus the PNG files.

``write_report(run)`` writes ``<run>/report.html`` and ``<run>/plots/*.png``;
``write_report(run_a, run_b, ..., out=folder)`` compares runs side by side (overlaid curves and
tables with one column per run). The code lives in :mod:`cramlm.report.html`; names are loaded on
first use so that importing the CLI (``cramlm --help``) does not import numpy and matplotlib.
"""

from __future__ import annotations

from typing import Any

__all__ = ["write_report", "render_html", "run_facts", "facts_table", "eval_table", "stages_table"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from cramlm.report import html

        return getattr(html, name)
    raise AttributeError(f"module 'cramlm.report' has no attribute '{name}'")
