"""Chrome trace-event JSON (opens in Perfetto / chrome://tracing).

One process per simulated device, one thread per stream (compute, pipeline sends,
data-parallel collectives, context-parallel K/V exchange); timestamps and durations in microseconds. Link
utilisation goes on counter tracks of a separate 'network' process, one counter per
busy link, in GB/s.
"""
from __future__ import annotations

import json
from pathlib import Path

from reports.files import output_file, write_file
from sim.result import StepResult

STREAM_TID = {"compute": 1, "pp": 2, "dp": 3, "cp": 4}
NET_PID = 1_000_000


def trace_events(res: StepResult, max_links: int = 16) -> list[dict]:
    ev: list[dict] = []
    for d in res.devices:
        ev.append({"ph": "M", "name": "process_name", "pid": d.rank,
                   "args": {"name": f"rank {d.rank} stage {d.stage} {d.gpu} ({d.pipeline}, x{d.represents})"}})
        ev.append({"ph": "M", "name": "process_sort_index", "pid": d.rank, "args": {"sort_index": d.rank}})
        for stream, tid in STREAM_TID.items():
            ev.append({"ph": "M", "name": "thread_name", "pid": d.rank, "tid": tid, "args": {"name": stream}})
    for s in sorted(res.segments, key=lambda s: (s.device, STREAM_TID.get(s.stream, 9), s.start_s, s.label)):
        ev.append({"ph": "X", "name": s.label, "cat": s.cat, "pid": s.device,
                   "tid": STREAM_TID.get(s.stream, 9), "ts": s.start_s * 1e6,
                   "dur": (s.end_s - s.start_s) * 1e6})
    if res.link_samples:
        busy = [row["link"] for row in res.busiest_links[:max_links]]
        ev.append({"ph": "M", "name": "process_name", "pid": NET_PID, "args": {"name": "network links"}})
        for t, edge, rate in res.link_samples:
            name = f"{edge[0]}->{edge[1]}"
            if name in busy:
                ev.append({"ph": "C", "name": name, "pid": NET_PID, "ts": t * 1e6,
                           "args": {"GB/s": rate / 1e9}})
    return ev


def trace_bytes(res: StepResult) -> bytes:
    return json.dumps({"traceEvents": trace_events(res), "displayTimeUnit": "ms"}).encode()


def write_trace(res: StepResult, path: str | Path) -> None:
    """Write the trace atomically (reports/files.py: never a half-written trace, never a
    file this run did not create removed)."""
    write_file(output_file(path, "--trace"), trace_bytes(res))
