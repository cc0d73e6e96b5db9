"""The multi-step report (`plansim simulate --steps N --report DIR`): throughput per step
(with --adaptive: against the fixed plan under the same scenario and the unslowed
cluster), where each simulated device's time went over the run, and the per-step table
(allocation, migration, scenario events, controller decisions). Files: index.html (plots
embedded, no scripts), report.md, steps.csv. Same inputs, same bytes (no wall times)."""
from __future__ import annotations

import csv
import html
import io
from pathlib import Path

from reports.files import output_dir, write_files
from reports.plots import COLORS, MAX_GANTT_ROWS, _figure, _style, to_data_uri
from sim.multistep import Comparison, RunResult
from sim.result import CATEGORIES


def throughput_plot(res: RunResult, cmp: Comparison | None) -> str:
    """Tokens/s per step; scenario events as dotted lines, controller moves as markers."""
    with _style():
        fig = _figure(3.4)
        ax = fig.add_subplot()
        xs = [s.step for s in res.steps]
        label = "adaptive" if res.adaptive else "this run"
        ax.plot(xs, [s.tokens_per_s for s in res.steps], marker="o", ms=3, color=COLORS["compute"], label=label)
        if cmp is not None:
            fx = cmp.fixed_steps_tokens_per_s[:len(xs)]
            ax.plot(xs[:len(fx)], fx, marker="s", ms=3, color=COLORS["dp"], label="fixed plan")
            ax.axhline(cmp.unslowed_tokens_per_s, color="#555555", ls="--", lw=1, label="unslowed cluster")
        moves = [s for s in res.steps if s.decision]
        if moves:
            ax.scatter([s.step for s in moves], [s.tokens_per_s for s in moves], marker="^", s=50,
                       color=COLORS["pp"], zorder=3, label="re-planned before this step")
        for s in res.steps:
            if s.events:
                ax.axvline(s.step, color="#999999", ls=":", lw=1)
        ax.set_xlabel("step")
        ax.set_ylabel("tokens/s")
        ax.set_ylim(bottom=0)
        ax.set_title("Throughput per step (dotted: a scenario event takes effect)")
        ax.legend(loc="lower right", fontsize=8, frameon=False)
        return to_data_uri(fig)


def device_totals(res: RunResult) -> list[tuple[str, dict[str, float]]]:
    """Seconds per category summed over the run, per device (replica d, stage s; its TP
    peers are identical), as (label, totals) rows in (replica, stage) order. Beyond
    MAX_GANTT_ROWS rows, the replicas that ever held a slowed device are shown stage by
    stage and the others as their mean per stage."""
    acc: dict[tuple[int, int], dict[str, float]] = {}
    slowed: set[int] = set()
    for st in res.steps:
        for d in st.devices:
            if "@" in d.pipeline:
                slowed.update(d.replicas)
            for r in d.replicas:
                tot = acc.setdefault((r, d.stage), dict.fromkeys(CATEGORIES, 0.0))
                for k in CATEGORIES:
                    tot[k] += d.breakdown_s[k]
    keys = sorted(acc)
    if len(keys) <= MAX_GANTT_ROWS:
        return [(f"replica {r} stage {s}", acc[(r, s)]) for r, s in keys]
    rows = [(f"replica {r} stage {s} (slowed)", acc[(r, s)]) for r, s in keys if r in slowed]
    for stage in sorted({s for _, s in keys}):
        others = [acc[(r, s)] for r, s in keys if s == stage and r not in slowed]
        if others:
            rows.append((f"mean of {len(others)} other replicas, stage {stage}",
                         {k: sum(t[k] for t in others) / len(others) for k in CATEGORIES}))
    return rows[:MAX_GANTT_ROWS]


def device_plot(res: RunResult) -> str:
    rows = device_totals(res)
    with _style():
        fig = _figure(1.4 + 0.22 * len(rows))
        ax = fig.add_subplot()
        ys = list(range(len(rows)))[::-1]
        left = [0.0] * len(rows)
        for cat in CATEGORIES:
            widths = [t[cat] for _, t in rows]
            ax.barh(ys, widths, left=left, color=COLORS[cat], label=cat, height=0.7,
                    edgecolor="#666666" if cat == "idle" else "none", linewidth=0.4)
            left = [a + b for a, b in zip(left, widths)]
        ax.set_yticks(ys, [label for label, _ in rows], fontsize=7)
        ax.set_xlabel("seconds over the run")
        ax.set_title("Where each device's time went (compute, exposed communication, bubble, idle)")
        fig.legend(ncols=len(CATEGORIES), loc="outside upper center", frameon=False, fontsize=8)
        return to_data_uri(fig)


def _units(u: list[int]) -> str:
    return f"{u[0]}x{len(u)}" if len(set(u)) == 1 else ":".join(map(str, u))


def step_rows(res: RunResult, cmp: Comparison | None) -> list[list[str]]:
    rows = []
    for i, s in enumerate(res.steps):
        fixed = cmp.fixed_steps_tokens_per_s[i] if cmp is not None and i < len(cmp.fixed_steps_tokens_per_s) else None
        rows.append([str(s.step), f"{s.step_time_s:.4f}", f"{s.tokens_per_s:.0f}",
                     "" if fixed is None else f"{fixed:.0f}", _units(s.mb_shares), _units(s.layers),
                     f"{s.migration_s:.3f}" if s.migration_s else "", "; ".join(s.events + [s.decision] * bool(s.decision))])
    return rows


HEADERS = ["step", "step s", "tokens/s", "fixed tokens/s", "mb_shares", "layers", "migration s", "events / decision"]


def summary_lines(res: RunResult, cmp: Comparison | None) -> list[str]:
    lines = [f"{res.model} on {res.topology}, plan {res.plan}, scenario '{res.scenario}'"
             f"{', adaptive' if res.adaptive else ''}: {len(res.steps)} steps in {res.total_time_s:.3f} simulated s, "
             f"{res.tokens_per_s:.0f} tokens/s."]
    if res.stopped:
        lines.append(res.stopped)
    if cmp is not None:
        rec = "n/a (the scenario cost nothing)" if cmp.recovered_frac is None else f"{cmp.recovered_frac:.1%}"
        lines.append(f"From step {cmp.from_step} on: unslowed {cmp.unslowed_tokens_per_s:.0f}, fixed plan "
                     f"{cmp.fixed_tokens_per_s:.0f}, adaptive {cmp.adaptive_tokens_per_s:.0f} tokens/s; the adaptive "
                     f"run recovers {rec} of the throughput the fixed plan lost (transition steps and migrations "
                     "included).")
    if res.final_plan != res.plan:
        lines.append(f"Final plan: {res.final_plan}")
    return lines


def render(res: RunResult, cmp: Comparison | None = None) -> dict[str, bytes]:
    rows = step_rows(res, cmp)
    lines = summary_lines(res, cmp)
    tput, dev = throughput_plot(res, cmp), device_plot(res)
    esc = html.escape
    table = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>\n" for r in rows)
    page = (
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>plansim multi-step run</title>"
        "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}td,th{padding:2px 6px;"
        "font-size:12px;text-align:right}td:last-child{text-align:left}</style></head><body>\n"
        "<h1>Multi-step run</h1>\n" + "".join(f"<p>{esc(x)}</p>\n" for x in lines)
        + f"<img alt=\"throughput per step\" src=\"{tput}\">\n<img alt=\"time per device\" src=\"{dev}\">\n"
        "<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in HEADERS) + "</tr>\n" + table + "</table>\n"
        "</body></html>\n")
    md = "# Multi-step run\n\n" + "\n\n".join(lines) + "\n\n| " + " | ".join(HEADERS) + " |\n|" + \
        "---|" * len(HEADERS) + "\n" + "".join("| " + " | ".join(c.replace("|", "/") for c in r) + " |\n" for r in rows)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(HEADERS)
    w.writerows(rows)
    return {"index.html": page.encode(), "report.md": md.encode(), "steps.csv": buf.getvalue().encode()}


def write_multistep_report(out_dir: str | Path, res: RunResult, cmp: Comparison | None = None) -> list[Path]:
    """Render everything first, then write the files into ``out_dir`` (under its lock)."""
    out = output_dir(out_dir, "--report")
    return write_files(out, render(res, cmp))
