"""The validation report: measured vs predicted for plans run for real (plansim validate).

Writes into one folder, all files or none (reports/files.py):
- ``index.html`` and ``report.md``: the table (measured and predicted median step time,
  error, Spearman rank correlation), predicted-vs-measured scatter, per-plan phase bars,
  and the calibration curves (fitted model against the measured microbenchmark points)
  when the profile's measurements (``PROFILE.bench.json``, written by plansim calibrate
  beside the profile) are found;
- ``validation.csv`` and ``validation.json``;
- two Chrome traces per plan, laid out alike (reports/trace.py: one process per rank,
  threads compute / pp / dp): ``trace-<i>-measured.json`` (the last measured step of the
  real run) and ``trace-<i>-simulated.json``.
"""
from __future__ import annotations

import csv
import html
import io
import json
import math
from pathlib import Path

from reports.files import output_dir, write_files
from reports.plots import _figure, _style, short_label, to_data_uri
from reports.trace import trace_bytes
from sim.result import CATEGORIES
from validate.record import MeasuredTimeline, RunRecord, timeline

HEADERS = ("plan", "processes", "measured_ms", "p10_ms", "p90_ms", "predicted_ms", "error_pct",
           "activations_measured_MiB", "activations_predicted_MiB")


def bench_path(profile_path: str | None) -> Path | None:
    """The measurements plansim calibrate left beside a profile (P.yaml -> P.bench.json,
    validate/bench_record.bench_record_path), when there is such a path; None otherwise."""
    from validate.bench_record import bench_record_path
    if not profile_path:
        return None
    q = bench_record_path(profile_path)
    return q if q.exists() else None


def load_benches(profiles: dict | None) -> dict[str, dict]:
    """Each profile's calibration record (P.bench.json beside P.yaml, when there), read and
    checked (validate/bench_record.load_bench_dict), by profile path. plansim validate
    calls it before the runs, so that a damaged record is a one-line input error then,
    not a traceback after minutes of measurement."""
    from validate.bench_record import load_bench_dict
    out: dict[str, dict] = {}
    for path in (profiles or {}).values():
        bp = bench_path(path)
        if bp is not None and str(path) not in out:
            out[str(path)] = load_bench_dict(bp, "--profile (its .bench.json record)")
    return out


def measured_result(c) -> MeasuredTimeline:
    """The measured run's last step, every rank a device with the record's segments, so
    that reports/trace.py lays it out exactly like the simulated one: the run record's own
    timeline (validate/record.timeline), not a second reading of the record."""
    return timeline(RunRecord.from_dict(c.record))


def scatter(comps) -> str:
    with _style():
        fig = _figure(4.0)
        ax = fig.add_subplot()
        xs = [c.measured_step_time_s * 1e3 for c in comps]
        ys = [c.predicted_step_time_s * 1e3 for c in comps]
        lo, hi = min(xs + ys) * 0.8, max(xs + ys) * 1.2
        ax.fill_between([lo, hi], [lo * 0.85, hi * 0.85], [lo * 1.15, hi * 1.15], color="#dddddd", label="+-15 %")
        ax.plot([lo, hi], [lo, hi], color="#555555", linewidth=1.0, label="predicted = measured")
        ax.scatter(xs, ys, color="#1f77b4", zorder=3)
        for i, (x, y) in enumerate(zip(xs, ys)):
            ax.annotate(str(i + 1), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.set_xlabel("measured median step time (ms)")
        ax.set_ylabel("predicted step time (ms)")
        ax.set_title("Predicted vs measured, one point per plan (numbers: table rows)")
        ax.legend(frameon=False, fontsize=8)
        return to_data_uri(fig)


def phase_bars(comps) -> str:
    """Per plan, measured and predicted phases side by side (stacked)."""
    from reports.plots import COLORS
    with _style():
        fig = _figure(1.2 + 0.5 * len(comps))
        ax = fig.add_subplot()
        labels, ys = [], []
        for i, c in enumerate(comps):
            for j, (kind, key) in enumerate((("measured", "measured_s"), ("predicted", "predicted_s"))):
                y = -(3 * i + j)
                left = 0.0
                for cat in CATEGORIES:
                    w = c.phases[cat][key] * 1e3
                    ax.barh([y], [w], left=left, color=COLORS[cat], height=0.8,
                            label=cat if (i, j) == (0, 0) else None)
                    left += w
                ys.append(y)
                labels.append(f"{short_label(i + 1, c.plan, 36)} {kind}")
        ax.set_yticks(ys, labels, fontsize=7)
        ax.set_xlabel("ms per step (mean over ranks)")
        ax.set_title("Phases: measured vs predicted")
        fig.legend(ncols=len(CATEGORIES), loc="outside upper center", frameon=False, fontsize=8)
        return to_data_uri(fig)


def calibration_curves(bench: dict, profile_path: str) -> str:
    """Fitted cost model against the measured microbenchmark points: GEMM time vs FLOPs,
    memory-op time vs bytes, collective time vs size."""
    from costmodel.gpus import get_gpu
    from costmodel.profile import load_profile
    from specs.topology import load_topology
    from validate.calibrate import _gemm_op, _mem_op, collective_time_s, FIT_PRECISION
    from costmodel.efficiency import op_time_s
    from validate.bench_record import MicrobenchResult

    res = MicrobenchResult.from_dict(bench)
    prof = load_profile(profile_path)
    gpu = get_gpu(bench.get("gpu", "CPU"))
    eff = prof.gpu(gpu.name)
    with _style():
        fig = _figure(3.6)
        axes = fig.subplots(1, 3)
        for ax, pts, title in ((axes[0], [(g.flops, g.seconds, op_time_s(_gemm_op(g), gpu, eff, FIT_PRECISION))
                                           for g in res.gemm], "GEMMs (x: FLOP)"),
                               (axes[1], [(s.bytes, s.seconds, op_time_s(_mem_op(s), gpu, eff, FIT_PRECISION))
                                          for s in res.memory], "memory-bound ops (x: bytes)")):
            pts.sort()
            ax.loglog([p[0] for p in pts], [p[1] * 1e6 for p in pts], "o", ms=3, label="measured")
            ax.loglog([p[0] for p in pts], [p[2] * 1e6 for p in pts], "-", lw=1, label="fitted model")
            ax.set_title(title, fontsize=9)
            ax.set_ylabel("us per call")
            ax.legend(frameon=False, fontsize=7)
        ax = axes[2]
        topo = bench.get("topology")
        if res.collectives and topo:
            cl = load_topology(topo, gpus_per_node=res.world)
            node = cl.nodes[0]
            fab = prof.fabric(node.intra_kind)
            for op in dict.fromkeys(s.op for s in res.collectives):
                pts = sorted((s.nbytes, s.seconds) for s in res.collectives if s.op == op)
                line = ax.loglog([p[0] for p in pts], [p[1] * 1e6 for p in pts], "o", ms=3, label=op)
                if op != "broadcast":
                    ax.loglog([p[0] for p in pts], [collective_time_s(op, p[0], res.world, node.intra_bw_Bps,
                                                                       node.intra_latency_s, fab) * 1e6 for p in pts],
                              "-", lw=1, color=line[0].get_color())
            ax.set_title(f"collectives, {res.world} processes (x: bytes)", fontsize=9)
            ax.legend(frameon=False, fontsize=6)
        return to_data_uri(fig)


def table_rows(comps) -> list[list[str]]:
    """One row per plan (HEADERS); the activations kept for backward are the busiest
    measured rank's and its prediction (validate/compare.saved_activations), blank when
    not measured."""
    def mib(c, key):
        return f"{c.saved[key] / 2**20:.3f}" if c.saved else ""
    return [[c.plan, str(c.world), f"{c.measured_step_time_s * 1e3:.2f}", f"{c.p10_step_time_s * 1e3:.2f}",
             f"{c.p90_step_time_s * 1e3:.2f}", f"{c.predicted_step_time_s * 1e3:.2f}", f"{c.error_pct:+.1f}",
             mib(c, "measured_bytes"), mib(c, "predicted_bytes")]
            for c in comps]


def write_validation_report(out_dir: str | Path, ranking, profiles: dict | None = None,
                            benches: dict[str, dict] | None = None) -> list[Path]:
    """Write the report files (module doc); ``profiles`` maps world -> profile path,
    ``benches`` their calibration records (load_benches; read here when not given)."""
    out = output_dir(out_dir)
    benches = load_benches(profiles) if benches is None else benches
    comps = ranking.comparisons
    rows = table_rows(comps)
    rho = ranking.spearman
    summary = (f"Plans: {len(comps)}. Largest |error|: {ranking.max_abs_error_pct:.1f} %. "
               f"Spearman rank correlation: {'n/a' if rho is None or math.isnan(rho) else f'{rho:.3f}'}; "
               f"same order: {'yes' if ranking.same_order() else 'no'}; order of the plans the runs tell apart "
               f"(launch medians that do not overlap): {'yes' if ranking.resolved_order() else 'no'}.")
    figs = [("Predicted vs measured", scatter(comps)), ("Phases", phase_bars(comps))]
    for world, path in sorted((profiles or {}).items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
        if str(path) in benches:
            figs.append((f"Calibration curves ({path})", calibration_curves(benches[str(path)], path)))
    files: dict[str, bytes] = {}
    for i, c in enumerate(comps, 1):
        files[f"trace-{i}-measured.json"] = trace_bytes(measured_result(c))
        files[f"trace-{i}-simulated.json"] = trace_bytes(c.sim)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(HEADERS)
    w.writerows(rows)
    md = ["# Validation: measured vs predicted", "", summary, "",
          "| # | " + " | ".join(HEADERS) + " |", "|" + "---|" * (len(HEADERS) + 1)]
    md += [f"| {i} | " + " | ".join(r) + " |" for i, r in enumerate(rows, 1)]
    md += ["", "Traces (open in https://ui.perfetto.dev): "
           + ", ".join(f"`trace-{i}-measured.json` / `trace-{i}-simulated.json`" for i in range(1, len(comps) + 1))]
    body = [f"<h1>Validation: measured vs predicted</h1><p>{html.escape(summary)}</p><table border=1 cellpadding=3>",
            "<tr><th>#</th>" + "".join(f"<th>{h}</th>" for h in HEADERS) + "<th>traces</th></tr>"]
    for i, r in enumerate(rows, 1):
        links = f'<a href="trace-{i}-measured.json">measured</a> / <a href="trace-{i}-simulated.json">simulated</a>'
        body.append(f"<tr><td>{i}</td>" + "".join(f"<td>{html.escape(x)}</td>" for x in r) + f"<td>{links}</td></tr>")
    body.append("</table>")
    for title, uri in figs:
        body.append(f"<h2>{html.escape(title)}</h2><img src=\"{uri}\" style=\"max-width:100%\">")
    page = "<!doctype html><html><head><meta charset=utf-8><title>plansim validation</title></head><body>" \
           + "\n".join(body) + "</body></html>"
    files = {"index.html": page.encode(), "report.md": ("\n".join(md) + "\n").encode(),
             "validation.csv": buf.getvalue().encode(),
             "validation.json": json.dumps(ranking.to_dict(), indent=2).encode(), **files}
    return write_files(out, files)
