"""What one worker measures during a step: time per category, per detail, bytes sent,
and the step's segments in the simulator's layout (sim/result.py Segment fields).

Spans nest (a TP all-reduce inside a forward, a DP bucket launch inside a backward);
each span's *exclusive* time goes to its category, so the categories of one rank add up
to the time it was busy or waiting, never more. The rest of the slowest rank's step is
``idle`` (computed in validate/record.py).

Segments follow sim/engine.py: the ``compute`` stream carries one segment per span with
its category (compute, tp, pp, bubble, dp); the ``pp`` stream carries sends (cat
'send'); the ``dp`` stream carries each asynchronous collective from launch until its
wait returned (cat 'collective'; an upper bound of its true duration, which the host
cannot observe more precisely without polling).
"""
from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager

from sim.result import CATEGORIES

class Recorder:
    """Per-process timing of one step at a time; times in seconds (perf_counter)."""

    def __init__(self, cuda: bool = False):
        self._sync = None
        if cuda:
            import torch
            # Host timers see device work only after a sync, and only this stream's: a
            # device-wide torch.cuda.synchronize would also wait for NCCL's own streams, where
            # validate/pp.py has posted every receive of the step before its first action,
            # so stage 0's first span would wait for a gradient that stage 1 sends only after
            # stage 0's activation (a deadlock), and an overlapped gradient all-reduce would
            # be timed as finished inside the span that launched it. Collectives join this
            # stream through their work's wait() (or a blocking call), so a span that
            # waits for one still times it.
            self._sync = lambda: torch.cuda.current_stream().synchronize()
        self._stack: list[list[float]] = []
        self.begin_step()

    def now(self) -> float:
        if self._sync is not None:
            self._sync()
        return time.perf_counter()

    def begin_step(self) -> None:
        self.phases_s: dict[str, float] = {c: 0.0 for c in CATEGORIES}
        self.detail_s: dict[str, float] = defaultdict(float)
        self.bytes_sent: dict[str, float] = defaultdict(float)
        self.segments: list[dict] = []
        self.t0 = self.now()

    @contextmanager
    def span(self, cat: str, detail: str, label: str):
        """Time the block; its exclusive time goes to ``cat`` and ``detail``."""
        if cat not in CATEGORIES:
            raise ValueError(f"unknown category {cat!r}")
        start = self.now()
        frame = [0.0]  # time spent in nested spans
        self._stack.append(frame)
        try:
            yield
        finally:
            end = self.now()
            self._stack.pop()
            dur = end - start
            if self._stack:
                self._stack[-1][0] += dur
            self.phases_s[cat] += dur - frame[0]
            self.detail_s[detail] += dur - frame[0]
            self.segment("compute", cat, start, end, label)

    def segment(self, stream: str, cat: str, start: float, end: float, label: str) -> None:
        """A segment on ``stream`` from absolute perf_counter times (stored relative)."""
        self.segments.append({"stream": stream, "cat": cat, "start_s": start - self.t0,
                              "end_s": end - self.t0, "label": label})

    def sent(self, kind: str, nbytes: float) -> None:
        """Bytes this rank put on the wire, by kind ('dp', 'tp', 'pp', 'cp')."""
        self.bytes_sent[kind] += float(nbytes)

    def end_step(self) -> dict:
        wall = self.now() - self.t0
        return {"wall_s": wall, "phases_s": dict(self.phases_s), "detail_s": dict(self.detail_s),
                "bytes_sent": dict(self.bytes_sent), "segments": list(self.segments)}


