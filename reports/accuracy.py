"""The accuracy report: predicted vs published figures of the published training runs.

Writes ``index.html`` (table, figures and the predicted-vs-published scatter plot with the
+-10 % band, embedded as a base64 PNG), ``report.md`` (the same table; the plot as
``accuracy.png`` beside it) and ``accuracy.csv`` into one folder. Same inputs, same bytes:
no timestamps or wall-clock times, rows in file order, the plot rendered with matplotlib's
default style and no PNG metadata. Every file is written under a temporary name first and
renamed only when all were written.
"""
from __future__ import annotations

import base64
import csv
import html
import io
import math
from pathlib import Path

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from reports.files import output_dir, write_files
from validate.accuracy import AccuracyResult

FILES = ("index.html", "report.md", "accuracy.png", "accuracy.csv")
BAND = 0.10  # the +-10 % band drawn around y = x (issue #3's accuracy target)
UNITS = {"iter_time_s": "s/iteration", "hw_tflops_per_gpu": "TFLOP/s/GPU",
         "megatron_tflops_per_gpu": "TFLOP/s/GPU (Megatron)"}
HEADERS = ("run", "source", "published", "predicted", "error", "plan", "topology", "profiles")


def table_rows(res: AccuracyResult) -> list[list[str]]:
    """One row per published run, formatted for people (same in HTML, Markdown and CSV)."""
    out = []
    for r in res.rows:
        unit = UNITS.get(r.row.figure_kind, r.row.figure_kind)
        out.append([r.row.run_id, r.row.source, f"{r.published:.2f} {unit}", f"{r.predicted:.2f} {unit}",
                    f"{100 * r.error:+.1f} %", r.plan, r.topology, " + ".join(r.profiles)])
    return out


def _groups(res: AccuracyResult) -> dict[str, list]:
    """Rows per GPU type, in order of first appearance (only when rows use several): the
    A100 rows (K22, BLOOM) and the H100 rows (Megatron-Core) are read apart."""
    out: dict[str, list] = {}
    for r in res.rows:
        out.setdefault(r.row.gpu, []).append(r)
    return out if len(out) > 1 else {}


def summary_lines(res: AccuracyResult) -> list[str]:
    rho = "n/a" if res.spearman is None or math.isnan(res.spearman) else f"{res.spearman:.3f}"
    worst = max(res.rows, key=lambda r: abs(r.error))
    return [
        f"Rows: {len(res.rows)} (from {Path(res.rows_file).name})",
        f"MAPE: {100 * res.mape:.2f} % (target <= 10 %)",
        f"Spearman rank correlation over the {len(res.sweep_ids)} sweep rows: {rho} (target >= 0.8)",
        f"Largest error: {worst.row.run_id} {100 * worst.error:+.1f} %",
    ] + [f"{name} rows ({len(rs)}, runtimes {', '.join(dict.fromkeys(r.row.runtime for r in rs))}): "
         f"MAPE {100 * sum(abs(r.error) for r in rs) / len(rs):.2f} %, largest "
         f"{max(rs, key=lambda r: abs(r.error)).row.run_id} {100 * max(rs, key=lambda r: abs(r.error)).error:+.1f} %"
         for name, rs in _groups(res).items()] + ([f"User profile merged over every row's profiles: {res.profile}"] if res.profile else [])


def _draw(ax, rows, lo, hi, log: bool, label_ids: bool) -> None:
    line = [lo, hi]
    ax.fill_between(line, [v * (1 - BAND) for v in line], [v * (1 + BAND) for v in line],
                    color="#dddddd", label=f"+-{100 * BAND:.0f} %")
    ax.plot(line, line, color="#555555", linewidth=1.0, label="predicted = published")
    groups: dict[str, list] = {}
    for r in rows:
        groups.setdefault(r.row.runtime, []).append(r)
    markers = ["o", "s", "^", "D", "v"]
    for i, (name, members) in enumerate(sorted(groups.items())):
        ax.scatter([r.published for r in members], [r.predicted for r in members], s=22,
                   marker=markers[i % len(markers)], label=name, zorder=3)
        if label_ids:
            for r in members:
                ax.annotate(r.row.run_id, (r.published, r.predicted), fontsize=6.5,
                            xytext=(3, 3), textcoords="offset points")
    if log:
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_aspect("equal")


def scatter_png(res: AccuracyResult) -> bytes:
    """Predicted against published with y = x and the +-10 % band: all rows on log axes,
    and (when there is a sweep) its rows zoomed in on linear axes, labelled."""
    sweep = [r for r in res.rows if r.row.run_id in set(res.sweep_ids)]
    with matplotlib.rc_context():
        matplotlib.rcdefaults()  # a user's matplotlibrc cannot change the bytes
        matplotlib.rcParams.update({"font.family": "DejaVu Sans", "font.size": 9.0,
                                    "axes.spines.top": False, "axes.spines.right": False})
        fig = Figure(figsize=(12.0 if sweep else 6.5, 6.0), dpi=100, layout="constrained")
        FigureCanvasAgg(fig)
        kinds = ", ".join(sorted({UNITS.get(r.row.figure_kind, r.row.figure_kind) for r in res.rows}))
        ax = fig.add_subplot(1, 2 if sweep else 1, 1)
        xs = [r.published for r in res.rows] + [r.predicted for r in res.rows]
        crowded = set(res.sweep_ids)
        _draw(ax, res.rows, min(xs) / 1.3, max(xs) * 1.3, log=True, label_ids=False)
        for r in res.rows:
            if r.row.run_id not in crowded:
                ax.annotate(r.row.run_id, (r.published, r.predicted), fontsize=6.5,
                            xytext=(3, -9), textcoords="offset points")
        ax.set_xlabel(f"published ({kinds})")
        ax.set_ylabel(f"predicted ({kinds})")
        ax.set_title(f"all {len(res.rows)} rows: MAPE {100 * res.mape:.1f} %")
        ax.legend(loc="upper left", fontsize=8)
        if sweep:
            ax2 = fig.add_subplot(1, 2, 2)
            zs = [r.published for r in sweep] + [r.predicted for r in sweep]
            pad = 0.05 * (max(zs) - min(zs)) + 1e-9
            _draw(ax2, sweep, min(zs) - pad, max(zs) + pad, log=False, label_ids=True)
            rho = "n/a" if res.spearman is None or math.isnan(res.spearman) else f"{res.spearman:.2f}"
            ax2.set_title(f"the {len(sweep)} sweep rows: Spearman {rho}")
            ax2.set_xlabel(f"published ({kinds})")
            ax2.set_ylabel(f"predicted ({kinds})")
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
        return buf.getvalue()


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def render_markdown(res: AccuracyResult) -> str:
    lines = ["# plansim accuracy against published training runs", ""]
    lines += [f"- {s}" for s in summary_lines(res)]
    lines += ["", "![predicted vs published](accuracy.png)", "",
              "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    for row in table_rows(res):
        lines.append("| " + " | ".join(_md_escape(c) for c in row) + " |")
    lines += ["", "## Framework defaults assumed per row", ""]
    for r in res.rows:
        lines.append(f"- **{r.row.run_id}**: " + "; ".join(_md_escape(n) for n in r.notes))
    return "\n".join(lines) + "\n"


def render_html(res: AccuracyResult, png: bytes) -> str:
    e = html.escape
    uri = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    head = "".join(f"<th>{e(h)}</th>" for h in HEADERS)
    body = []
    for r, row in zip(res.rows, table_rows(res)):
        cls = "ok" if abs(r.error) <= BAND else "off"
        cells = "".join(f"<td>{e(c)}</td>" for c in row[:4]) + f'<td class="{cls}">{e(row[4])}</td>' + \
            "".join(f"<td>{e(c)}</td>" for c in row[5:])
        body.append(f"<tr>{cells}</tr>")
    notes = "".join(f"<li><b>{e(r.row.run_id)}</b>: {e('; '.join(r.notes))}</li>" for r in res.rows)
    summary = "".join(f"<li>{e(s)}</li>" for s in summary_lines(res))
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<title>plansim accuracy</title><style>"
        "body{font-family:sans-serif;margin:2em;max-width:1400px}img{max-width:100%;height:auto}"
        "table{border-collapse:collapse;font-size:0.85em}td,th{border:1px solid #ccc;padding:3px 6px;text-align:left}"
        "td.ok{background:#e6f4e6}td.off{background:#f8e0e0}</style></head><body>\n"
        "<h1>plansim accuracy against published training runs</h1>\n"
        f"<ul>{summary}</ul>\n"
        f"<img alt=\"predicted vs published\" src=\"{uri}\">\n"
        f"<table><thead><tr>{head}</tr></thead><tbody>\n" + "\n".join(body) + "\n</tbody></table>\n"
        f"<h2>Framework defaults assumed per row</h2><ul>{notes}</ul>\n</body></html>\n"
    )


def render_csv(res: AccuracyResult) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["run_id", "figure_kind", "published", "predicted", "error", "plan", "topology", "profiles"])
    for r in res.rows:
        w.writerow([r.row.run_id, r.row.figure_kind, f"{r.published:.6g}", f"{r.predicted:.6g}",
                    f"{r.error:.6f}", r.plan, r.topology, "+".join(r.profiles)])
    return buf.getvalue()


def render(res: AccuracyResult) -> dict[str, bytes]:
    png = scatter_png(res)
    return {"index.html": render_html(res, png).encode(), "report.md": render_markdown(res).encode(),
            "accuracy.png": png, "accuracy.csv": render_csv(res).encode()}


def write_accuracy_report(out_dir: str | Path, res: AccuracyResult) -> list[Path]:
    """Write the report files into ``out_dir`` (created if needed), all or none."""
    out = output_dir(out_dir)
    files = render(res)  # may fail: nothing written yet
    return write_files(out, {name: files[name] for name in FILES})
