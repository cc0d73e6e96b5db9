"""Report figures as PNG data URIs (matplotlib Agg canvas, no pyplot global state).

Deterministic by construction: matplotlib defaults plus a fixed style (bundled DejaVu
fonts), fixed sizes and DPI, stable input order, and PNGs saved without the 'Software'
metadata entry (the only varying chunk matplotlib writes by default; it adds no date).
"""
from __future__ import annotations

import base64
import io
import math
from contextlib import contextmanager

from specs.plan import parse_plan_string

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from reports.tables import group_utilisation, tp_pp_grid
from sim.result import CATEGORIES, StepResult

DPI = 100
WIDTH_IN = 10.0
STYLE = {
    "font.family": "DejaVu Sans", "font.size": 9.0, "axes.titlesize": 10.0,
    "axes.spines.top": False, "axes.spines.right": False, "svg.hashsalt": "plansim",
    "path.simplify": True, "image.interpolation": "nearest",
}
# One colour per category of time (and per comm-stream activity in the Gantt chart).
COLORS = {
    "compute": "#4c72b0", "tp": "#dd8452", "cp": "#da8bc3", "pp": "#55a868", "dp": "#c44e52",
    "bubble": "#b0b0b0", "idle": "#e8e8e8", "send": "#8172b3", "collective": "#937860",
}
MEMORY_COLORS = {"weights": "#4c72b0", "grads": "#55a868", "optimizer": "#dd8452",
                 "activations": "#c44e52", "logits": "#8172b3"}
STREAM_ORDER = {"compute": 0, "pp": 1, "dp": 2, "cp": 3}
MAX_GANTT_ROWS = 64
MAX_BAR_PLANS = 20


@contextmanager
def _style():
    # Start from matplotlib's defaults so a user's matplotlibrc cannot change the bytes.
    with matplotlib.rc_context():
        matplotlib.rcdefaults()
        matplotlib.rcParams.update(STYLE)
        yield


def _figure(height_in: float) -> Figure:
    fig = Figure(figsize=(WIDTH_IN, round(height_in, 2)), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def to_data_uri(fig: Figure) -> str:
    """PNG bytes of `fig` as a data: URI, with no metadata that varies between runs."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


NUMERIC_KEYS = ("tp", "cp", "pp", "dp", "mbs", "vpp", "zero")
VALUE_ONLY_KEYS = ("schedule", "allreduce", "placement", "recompute", "precision", "compress", "cp_comm")


def short_label(rank: int, plan: str, width: int = 48) -> str:
    """'#3 tp2 pp4 dp2 mbs1 interleaved ...' for an axis: the table row of that rank has it all."""
    parts = []
    for key, value in parse_plan_string(plan).items():
        value = ":".join(value) if isinstance(value, list) else value
        item = f"{key}={value}"
        if key in NUMERIC_KEYS:
            parts.append(f"{key}{value}")
        elif key == "schedule" and value == "1f1b":
            continue  # the default schedule
        elif key in VALUE_ONLY_KEYS:
            parts.append(value)
        elif key == "sp":
            parts.append("sp")
        else:
            parts.append(item)
    text = f"#{rank} " + " ".join(parts)
    return text if len(text) <= width else text[: width - 1] + "\u2026"


def breakdown_bars(results: list[StepResult]) -> str:
    """Stacked horizontal bars of the step time per plan, best plan on top."""
    shown = results[:MAX_BAR_PLANS]
    with _style():
        fig = _figure(1.2 + 0.32 * len(shown))
        ax = fig.add_subplot()
        ys = list(range(len(shown)))[::-1]
        left = [0.0] * len(shown)
        for cat in CATEGORIES:
            widths = [r.breakdown.get(cat, 0.0) for r in shown]
            ax.barh(ys, widths, left=left, color=COLORS[cat], label=cat, height=0.7,
                    edgecolor="#666666" if cat == "idle" else "none", linewidth=0.4)
            left = [a + b for a, b in zip(left, widths)]
        ax.set_yticks(ys, [short_label(i + 1, r.plan) for i, r in enumerate(shown)])
        ax.set_xlabel("seconds per step (mean over devices)")
        ax.set_title("Step time: compute, exposed communication, bubble and idle")
        fig.legend(ncols=len(CATEGORIES), loc="outside upper center", frameon=False, fontsize=8)
        return to_data_uri(fig)


def gantt(res: StepResult, title: str) -> str:
    """Pipeline timeline: one row per simulated device and stream, coloured by category."""
    stage_of = {d.rank: (d.stage, d.gpu) for d in res.devices}
    all_rows = sorted({(s.device, s.stream) for s in res.segments},
                      key=lambda k: (k[0], STREAM_ORDER.get(k[1], 9), k[1]))
    rows = all_rows[:MAX_GANTT_ROWS]
    if len(all_rows) > len(rows):
        title += f" (first {len(rows)} of {len(all_rows)} rows; all are in the trace)"
    index = {k: i for i, k in enumerate(rows)}
    spans: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for s in res.segments:
        i = index.get((s.device, s.stream))
        if i is not None and s.end_s > s.start_s:
            spans.setdefault((i, s.cat), []).append((s.start_s, s.end_s - s.start_s))
    with _style():
        fig = _figure(1.4 + 0.24 * len(rows))
        ax = fig.add_subplot()
        for (i, cat), xr in sorted(spans.items()):
            ax.broken_barh(sorted(xr), (i - 0.4, 0.8), facecolors=COLORS.get(cat, "#000000"),
                           edgecolor="none")
        labels = []
        for dev, stream in rows:
            stage, gpu = stage_of.get(dev, ("?", ""))
            labels.append(f"rank {dev} stage {stage} {gpu.split('-')[0]} {stream}")
        ax.set_yticks(range(len(rows)), labels, fontsize=7)
        ax.set_ylim(len(rows) - 0.5, -0.5)
        ax.set_xlim(0.0, max(res.step_time_s, 1e-12))
        ax.set_xlabel("time in the step (s)")
        ax.set_title(title)
        used = [c for c in COLORS if any(k[1] == c for k in spans)]
        fig.legend(handles=[Patch(facecolor=COLORS[c], label=c) for c in used], ncols=len(used) or 1,
                   loc="outside upper center", frameon=False, fontsize=8)
        return to_data_uri(fig)


def memory_bars(res: StepResult, title: str) -> str:
    """Memory per simulated device, stacked by part, with each device's capacity."""
    parts = [p for p in MEMORY_COLORS if any(p in d.memory_gib for d in res.devices)]
    parts += sorted({p for d in res.devices for p in d.memory_gib} - set(parts))
    with _style():
        fig = _figure(3.0)
        ax = fig.add_subplot()
        xs = list(range(len(res.devices)))
        bottom = [0.0] * len(xs)
        for p in parts:
            vals = [d.memory_gib.get(p, 0.0) for d in res.devices]
            ax.bar(xs, vals, bottom=bottom, color=MEMORY_COLORS.get(p, "#999999"), label=p, width=0.6)
            bottom = [a + b for a, b in zip(bottom, vals)]
        for x, d in zip(xs, res.devices):
            ax.hlines(d.capacity_gib, x - 0.4, x + 0.4, colors="#000000", linestyles="dashed",
                      label="capacity" if x == 0 else None)
        ax.set_xticks(xs, [f"rank {d.rank}\nstage {d.stage}\n{d.gpu.split('-')[0]}" for d in res.devices],
                      fontsize=7)
        ax.set_xlim(-0.6, max(len(xs), 4) - 0.4)  # at least 4 slots: one device is not a wall
        ax.set_ylabel("GiB")
        ax.set_title(title)
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=8)
        return to_data_uri(fig)


def tp_pp_heatmap(results: list[StepResult]) -> str:
    """Best tokens/s for each (TP, PP) over the plans that fit in memory."""
    tps, pps, vals, notes = tp_pp_grid(results)
    finite = [v for row in vals for v in row if not math.isnan(v)]
    with _style():
        fig = _figure(1.4 + 0.45 * len(pps))
        ax = fig.add_subplot()
        cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#eeeeee")
        lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
        img = ax.imshow(vals, cmap=cmap, vmin=lo, vmax=hi if hi > lo else lo + 1.0, aspect="auto")
        for i in range(len(pps)):
            for j in range(len(tps)):
                v = vals[i][j]
                text = notes[i][j] if math.isnan(v) else f"{v / 1e3:,.1f}k"
                bright = not math.isnan(v) and hi > lo and (v - lo) / (hi - lo) > 0.6
                ax.text(j, i, text, ha="center", va="center", fontsize=8,
                        color="#000000" if bright or math.isnan(v) else "#ffffff")
        ax.set_xticks(range(len(tps)), [str(t) for t in tps])
        ax.set_yticks(range(len(pps)), [str(p) for p in pps])
        ax.set_xlabel("tensor parallel (tp)")
        ax.set_ylabel("pipeline parallel (pp)")
        ax.set_title("Best tokens/s per (tp, pp) among the compared plans")
        fig.colorbar(img, ax=ax, label="tokens/s")
        return to_data_uri(fig)


def group_utilisation_bars(results: list[StepResult], groups: list[str]) -> str:
    """Utilisation (compute + TP time over step time) per GPU type, for each plan shown."""
    shown = results[:8]
    width = 0.8 / max(len(groups), 1)
    palette = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860"]
    with _style():
        fig = _figure(3.4)
        ax = fig.add_subplot()
        for gi, g in enumerate(groups):
            xs = [i + (gi - (len(groups) - 1) / 2) * width for i in range(len(shown))]
            vals = [100.0 * group_utilisation(r).get(g, math.nan) for r in shown]
            ax.bar(xs, vals, width=width, color=palette[gi % len(palette)], label=g)
        ax.set_xticks(range(len(shown)), [f"#{i + 1}" for i in range(len(shown))])
        ax.set_ylim(0.0, 100.0)
        ax.set_ylabel("busy % of the step (compute + TP)")
        ax.set_xlabel("plan (rank in the table)")
        ax.set_title("Utilisation per device group")
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=8)
        return to_data_uri(fig)
