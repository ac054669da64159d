"""Which ran where: a run's segments (each start or resume to its stop) from its metrics.jsonl.

Each time the trainer starts or resumes it writes a ``"kind": "segment"`` line (the step it starts
from, the UTC time, pid, processes, threads, the machine: host, boot id, CPU and its x86 family,
accelerator, torch, and the code: version, git commit, whether the package's tracked files differed).
A segment ends at the next one, or with an ``interrupted`` event (a signal: checkpoint written), or
at the run's end. A segment that stopped without that event was cut off (SIGKILL, a session's hard
stop, a lost machine): the next one resumed from an earlier checkpoint, or started again from step 0
where none was written, and trained the steps between again; its table row says how many. Logs written before segment lines existed are split at their
``resumed`` events, without machine or time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any


@dataclass
class Segment:
    number: int
    start: int  # the step it started from: 0, or the checkpoint it resumed
    end: int | None = None  # the last step it logged (None: none)
    wall: str | None = None  # when it started, UTC (None: a log from before segment lines)
    info: dict[str, Any] = field(default_factory=dict)  # the segment line as written
    stopped: dict[str, Any] | None = None  # its `interrupted` event, when a signal stopped it
    resumed_from: str | None = None  # the checkpoint folder it resumed from
    ended: str = ""  # how it ended, in words (set by `segments`)
    retrained: int = 0  # steps the next segment trained again (cut off after its last checkpoint)
    last_elapsed: float | None = None  # the budget clock at its last logged line (seconds)

    @property
    def machine(self) -> str | None:
        """Where it ran; a multi-node job's machines each with their ranks."""
        m = self.info.get("machine") or {}
        if not m:
            return None
        others = [o for o in self.info.get("machines") or [] if isinstance(o, dict)]
        if not others:
            return _machine(m)
        theirs = {r for o in others for r in o.get("ranks") or []}
        first = [r for r in range(int(self.info.get("world_size") or 0)) if r not in theirs] or [0]
        return "; ".join(f"{_ranks(ranks)}: {_machine(x)}" for ranks, x in [(first, m), *((o.get("ranks") or [], o) for o in others)])

    @property
    def code(self) -> str | None:
        c = self.info.get("code") or {}
        if not c:
            return None
        commit = c.get("commit")
        return f"cramlm {c.get('version')}" + (f" @ {commit}{' + changes' if c.get('dirty') else ''}" if commit else " (no git)")

    @property
    def wall_end(self) -> str | None:
        """When it stopped: its interrupted event's time, else estimated from the budget clock
        (training seconds only, so a lower bound), prefixed by "~"."""
        if self.stopped and self.stopped.get("wall"):
            return self.stopped["wall"]
        began, clock = self.info.get("budget_seconds"), self.last_elapsed
        if self.wall and isinstance(began, (int, float)) and isinstance(clock, (int, float)) and clock >= began:
            try:
                return "~" + (datetime.fromisoformat(self.wall) + timedelta(seconds=clock - began)).isoformat(timespec="seconds")
            except ValueError:
                return None
        return None


def segments(metrics: list[dict[str, Any]], finished_steps: int | None = None) -> list[Segment]:
    """The run's segments in order. ``finished_steps``: summary.json's ``steps``, read only for a
    log from before ``finished`` lines (its last segment then ended "done" when it reached them)."""
    out: list[Segment] = []
    for r in metrics:
        kind, step = r.get("kind"), r.get("step")
        if kind == "segment":
            out.append(Segment(len(out) + 1, int(step or 0), wall=r.get("wall"), info=r))
        elif kind == "event" and r.get("event") == "resumed":
            current = out[-1] if out else None
            if current is None or current.end is not None or current.resumed_from or current.start != step:
                current = Segment(len(out) + 1, int(step or 0))  # a log from before segment lines
                out.append(current)
            current.resumed_from = r.get("from")
        elif isinstance(step, int) and kind in ("train", "val", "event", "finished"):
            if not out:
                out.append(Segment(1, 0))
            seg = out[-1]
            if kind in ("train", "val"):
                seg.end = step if seg.end is None else max(seg.end, step)
                if isinstance(r.get("elapsed"), (int, float)):
                    seg.last_elapsed = r["elapsed"]
            elif kind == "finished" or r.get("event") in ("interrupted", "failed"):
                seg.stopped = r
                seg.end = step if seg.end is None else max(seg.end, step)
    legacy = not any(s.info for s in out)
    for seg, after in zip(out, out[1:] + [None]):
        logged = seg.end
        if after is not None and after.start > (seg.end if seg.end is not None else seg.start):
            seg.end = after.start  # it wrote the checkpoint the next one resumed (a step logged only every log_every)
        last = seg.end if seg.end is not None else seg.start
        if after is not None and logged is not None and logged > after.start:
            seg.retrained = logged - after.start  # at least: it may have trained past its last logged step
        stop = seg.stopped or {}
        again = f": at least {seg.retrained} step{'s' * (seg.retrained != 1)} trained again" if seg.retrained else ""
        went_on = ("started again from step 0 (no checkpoint)" if after is not None and after.start == 0 and not after.resumed_from
                   else f"resumed from step {after.start if after is not None else '?'}")
        if stop.get("kind") == "finished":
            seg.ended = f"done at step {stop.get('step')}" + (
                f"; the next segment went on from step {after.start}" + (" (rewound)" if after.start < last else " (extended)")
                if after is not None else "")
        elif stop.get("event") == "failed":
            seg.ended = f"failed after step {stop.get('step')}: {stop.get('error', '?')}" + (
                f"; the next {went_on}{again}" if after is not None else "")
        elif stop:
            saved = stop.get("checkpoint", "?") not in (None, "None", "")
            seg.ended = (f"stopped by {stop.get('signal') or 'a signal'} after step {stop.get('step')}, "
                         + ("checkpoint written" if saved else "no checkpoint written")
                         + (f"; the next {went_on}{again}" if after is not None and (again or not saved) else ""))
        elif after is not None:
            seg.ended = (f"cut off after step {logged} (last logged)" if logged is not None else "cut off before logging a step") + (
                f"; the next {went_on}{again}")
        elif legacy and finished_steps is not None and last >= finished_steps:
            seg.ended = f"done at step {finished_steps}"
        else:
            seg.ended = (f"running, or cut off after step {logged} (last logged)" if logged is not None
                         else "running, or cut off before logging a step")
    return out


def current_lines(metrics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The run as it stands: every line but the train and val lines a later segment superseded (a
    segment cut off after its last checkpoint, or one a resume from an older checkpoint rewound,
    logged steps past the step the next one started from; those steps were trained again). Curves
    and last values read these; the segments table reads every line."""
    out: list[dict[str, Any]] = []
    for r in metrics:
        step = r.get("step")
        starts = r.get("kind") == "segment" or (r.get("kind") == "event" and r.get("event") == "resumed")
        if starts and isinstance(step, int):
            out = [m for m in out if not (m.get("kind") in ("train", "val") and isinstance(m.get("step"), int)
                                          and (m["step"] > step or step == 0))]  # a start again from step 0: all of them
        out.append(r)
    return out


def segment_rows(name: str, segs: list[Segment]) -> list[list[str]]:
    """Table rows: run, segment, steps, started and stopped (UTC), machine, code, processes x threads, how it ended."""
    rows = []
    for s in segs:
        steps = f"{s.start}-{s.end if s.end is not None else s.start}"
        procs = f"{s.info.get('world_size', '?')} x {s.info.get('threads', '?')}" if s.info else "-"
        rows.append([name, str(s.number), steps, when(s.wall), when(s.wall_end), s.machine or "-", s.code or "-", procs, s.ended])
    return rows


def _machine(m: dict[str, Any]) -> str:
    where = f"{m.get('host') or '?'} (boot {m.get('boot') or '?'})"
    return f"{where}, {m.get('accelerator') or m.get('cpu') or '?'}, torch {m.get('torch') or '?'}"


def _ranks(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> "ranks 0-2, 5"."""
    spans: list[list[int]] = []
    for r in sorted(ranks):
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
    return f"rank{'s' * (len(ranks) != 1)} {text}"


def when(iso: str | None) -> str:
    """An ISO time in UTC as people read it: 2026-12-07 00:23:28 ("~": estimated); "-": unknown."""
    return iso.replace("T", " ").removesuffix("+00:00") if iso else "-"


HEADER = ["run", "segment", "steps", "started (UTC)", "stopped (UTC)", "machine", "code", "processes x threads", "ended"]


def markdown(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
