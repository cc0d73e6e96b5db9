"""The sweep comparison report: ``index.html`` (plot embedded), ``report.md``, ``sweep.csv``
(one row per cell: its best plan and that plan's step time, throughput, MFU, memory) and
``scaling.png`` (the plot the Markdown shows), written together into one folder.

Same grid, same bytes, whichever executor searched the cells: no wall-clock times, cells
in grid order, figures rendered as reports/plots.py renders them (fixed style, no varying
PNG metadata). Files are written by reports/files.py (all or nothing, under a lock).
"""
from __future__ import annotations

import base64
from pathlib import Path

import pandas as pd
from jinja2 import Environment, FileSystemLoader, StrictUndefined
from tabulate import tabulate

from reports.files import output_dir, write_files
from reports.plots import _figure, _style, to_data_uri
from search.sweep import SweepResult

TEMPLATES = Path(__file__).parent / "templates"
CSV_COLUMNS = ("model", "topology", "nodes", "devices", "seq_length", "profile", "runtime", "best_plan",
               "step_time_s",
               "tokens_per_s", "tokens_per_s_per_gpu", "mfu", "model_tflops_per_gpu", "peak_memory_gib",
               "bottleneck", "candidates", "simulated", "no_fit")
TABLE = [("model", "model"), ("topology", "topology"), ("devices", "GPUs"), ("seq_length", "seq"),
         ("profile", "profile"), ("runtime", "runtime"), ("best_plan", "best plan"), ("step", "step s"),
         ("tps", "tokens/s"),
         ("tps_gpu", "tokens/s/GPU"), ("mfu", "MFU"), ("tflops", "TFLOP/s/GPU"), ("mem", "peak GiB"),
         ("bottleneck", "bottleneck")]
PALETTE = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]


def _series(row: dict, rows: list[dict]) -> str:
    """The plot line a cell belongs to: model and topology, plus seq/profile when they vary."""
    label = f"{row['model']} on {row['topology']}"
    if len({r["seq_length"] for r in rows if r["model"] == row["model"]}) > 1:  # the grid's seq_lengths
        label += f", seq {row['seq_length']}"
    if len({r["profile"] for r in rows}) > 1:
        label += f", {row['profile']}"
    if len({r["runtime"] for r in rows}) > 1:
        label += f", {row['runtime']}"
    return label


def scaling_plot(rows: list[dict]) -> bytes:
    """PNG: best tokens/s per GPU and MFU against the GPU count, one line per series."""
    series: dict[str, list[dict]] = {}
    for r in rows:
        if r["best_plan"]:
            series.setdefault(_series(r, rows), []).append(r)
    with _style():
        fig = _figure(3.6)
        ax1, ax2 = fig.subplots(1, 2)
        for i, (label, pts) in enumerate(series.items()):
            pts = sorted(pts, key=lambda r: r["devices"])
            xs = [r["devices"] for r in pts]
            style = {"color": PALETTE[i % len(PALETTE)], "marker": MARKERS[i % len(MARKERS)], "label": label}
            ax1.plot(xs, [r["tokens_per_s_per_gpu"] for r in pts], **style)
            ax2.plot(xs, [100.0 * r["mfu"] for r in pts], **style)
        ticks = sorted({r["devices"] for pts in series.values() for r in pts})
        for ax, ylabel in ((ax1, "tokens/s per GPU (best plan)"), (ax2, "MFU % (best plan)")):
            ax.set_xscale("log", base=2)
            ax.set_xticks(ticks, [f"{t:,}" for t in ticks])
            ax.minorticks_off()
            ax.set_xlabel("GPUs")
            ax.set_ylabel(ylabel)
        ax2.set_ylim(bottom=0.0)
        ax1.set_yscale("log")
        ax1.set_title("Throughput per GPU")
        ax2.set_title("Model FLOP utilisation")
        fig.legend(*ax1.get_legend_handles_labels(), loc="outside lower center", frameon=False, fontsize=8,
                   ncols=min(3, max(1, len(series))))
        uri = to_data_uri(fig)
    return base64.b64decode(uri.split(",", 1)[1])


def findings(rows: list[dict]) -> list[str]:
    """What the table says in words: the best cell, scaling per series, cells that do not fit."""
    out = []
    found = [r for r in rows if r["best_plan"]]
    if found:
        b = max(found, key=lambda r: (r["mfu"], -rows.index(r)))
        out.append(f"Highest MFU: {100 * b['mfu']:.1f} % for {b['model']} on {b['devices']:,} GPUs of "
                   f"{b['topology']} with {b['best_plan']} ({b['tokens_per_s']:,.0f} tokens/s).")
    by_series: dict[str, list[dict]] = {}
    for r in found:
        by_series.setdefault(_series(r, rows), []).append(r)
    for label, pts in by_series.items():
        lo, hi = min(pts, key=lambda r: r["devices"]), max(pts, key=lambda r: r["devices"])
        if hi["devices"] > lo["devices"]:
            eff = (hi["tokens_per_s"] / lo["tokens_per_s"]) / (hi["devices"] / lo["devices"])
            out.append(f"{label}: {lo['devices']:,} -> {hi['devices']:,} GPUs gives "
                       f"{hi['tokens_per_s'] / lo['tokens_per_s']:.2f}x the tokens/s "
                       f"({100 * eff:.0f} % scaling efficiency).")
    for r in rows:
        if not r["best_plan"]:
            out.append(f"{r['model']} on {r['devices']:,} GPUs of {r['topology']}: {r['no_fit']}")
    return out


def table_cells(rows: list[dict]) -> list[dict]:
    def num(v, fmt):
        return "" if v is None else fmt.format(v)
    """The table's cells formatted for people (HTML, Markdown and the terminal)."""
    return [{"model": r["model"], "topology": r["topology"], "devices": f"{r['devices']:,}",
             "seq_length": str(r["seq_length"]), "profile": r["profile"], "runtime": r["runtime"],
             "best_plan": r["best_plan"] or "no plan fits", "step": num(r["step_time_s"], "{:.3f}"),
             "tps": num(r["tokens_per_s"], "{:,.0f}"), "tps_gpu": num(r["tokens_per_s_per_gpu"], "{:,.0f}"),
             "mfu": "" if r["mfu"] is None else f"{100 * r['mfu']:.1f} %",
             "tflops": num(r["model_tflops_per_gpu"], "{:.1f}"), "mem": num(r["peak_memory_gib"], "{:.1f}"),
             "bottleneck": r["bottleneck"]} for r in rows]


def sweep_csv(result: SweepResult) -> str:
    """One row per cell, grid order, raw numbers in SI units (floats as repr: exact)."""
    return pd.DataFrame(result.rows(), columns=list(CSV_COLUMNS)).to_csv(index=False, lineterminator="\n")


def render(result: SweepResult) -> dict[str, bytes]:
    """File name -> bytes of the report (nothing is written)."""
    rows = result.rows()
    png = scaling_plot(rows) if any(r["best_plan"] for r in rows) else None
    cells = table_cells(rows)
    ctx = {"title": result.name, "grid": Path(result.source).name, "n_cells": len(rows), "findings": findings(rows),
           "headers": TABLE, "cells": cells, "plot": ("data:image/png;base64," + base64.b64encode(png).decode("ascii"))
           if png else None,
           "md_table": tabulate([[c[k] for k, _ in TABLE] for c in cells], headers=[h for _, h in TABLE],
                                tablefmt="github", disable_numparse=True)}
    env = Environment(loader=FileSystemLoader(str(TEMPLATES)), undefined=StrictUndefined,
                      autoescape=lambda name: bool(name) and name.endswith(".html.j2"),
                      trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    files = {"index.html": env.get_template("sweep.html.j2").render(**ctx).encode("utf-8"),
             "report.md": env.get_template("sweep.md.j2").render(**ctx).encode("utf-8"),
             "sweep.csv": sweep_csv(result).encode("utf-8")}
    if png:
        files["scaling.png"] = png
    return files


def write_sweep_report(out_dir: str | Path, result: SweepResult) -> list[Path]:
    """Write the report into ``out_dir`` (all files or none); returns the paths written."""
    out = output_dir(out_dir)
    return write_files(out, render(result))
