"""The plan-comparison report: `index.html` (plots embedded), `report.md`, `plans.csv`
and the Chrome trace `trace.json`, written side by side into one folder.

Same inputs, same bytes: no timestamps, no wall-clock times, stable ordering, and
figures rendered deterministically (reports/plots.py). Every file is first written
under a temporary name and renamed only when all of them were written, so a failure
leaves no half-written report behind.
"""
from __future__ import annotations

from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from tabulate import tabulate

from reports import plots
from reports.tables import device_groups, group_utilisation, plans_csv, tp_pp_grid
from reports.files import output_dir, write_files
from reports.trace import trace_bytes
from sim.result import CATEGORIES, SearchResult, StepResult

TEMPLATES = Path(__file__).parent / "templates"
FILES = ("index.html", "report.md", "plans.csv")
TRACE = "trace.json"


def _env() -> Environment:
    return Environment(loader=FileSystemLoader(str(TEMPLATES)), undefined=StrictUndefined,
                       autoescape=lambda name: bool(name) and name.endswith(".html.j2"),
                       trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)


def _pct(x: float) -> str:
    return f"{100.0 * x:.1f} %"


def ranked_rows(results: list[StepResult]) -> list[dict]:
    """The ranked table, formatted for people (same columns in HTML and Markdown)."""
    rows = []
    for i, r in enumerate(results, start=1):
        step = r.step_time_s or 1.0
        rows.append({
            "rank": i, "plan": r.plan, "tokens_per_s": f"{r.tokens_per_s:,.0f}",
            "step_time": f"{r.step_time_s:.3f}", "mfu": _pct(r.mfu), "hfu": _pct(r.hfu),
            "tflops": f"{r.model_tflops_per_gpu:.1f}",
            "exposed": " / ".join(f"{100 * r.breakdown.get(k, 0.0) / step:.1f}" for k in ("tp", "cp", "pp", "dp")),
            "bubble": _pct(r.bubble_fraction),
            "memory": f"{r.peak_memory_gib:.1f}",
            "fits": "yes" if r.fits_memory else f"no (+{r.memory_shortfall_gib:.1f} GiB)",
            "bottleneck": r.bottleneck, "fits_bool": r.fits_memory,
        })
    return rows


RANKED_HEADERS = [("rank", "#"), ("plan", "plan"), ("tokens_per_s", "tokens/s"), ("step_time", "step s"),
                  ("mfu", "MFU"), ("hfu", "HFU"), ("tflops", "TFLOP/s/GPU"),
                  ("exposed", "exposed TP/CP/PP/DP %"), ("bubble", "bubble"), ("memory", "peak GiB"),
                  ("fits", "fits"), ("bottleneck", "bottleneck")]


def findings(sr: SearchResult, single: bool = False) -> list[str]:
    """The search's own notes first, then what the ranked table says in words."""
    out = list(sr.notes)
    if not sr.ranked:
        return out + ["No plan was simulated."]
    best = sr.ranked[0]
    out.append(f"{'Plan' if single else 'Best plan'} {best.plan}: {best.tokens_per_s:,.0f} tokens/s, "
               f"step {best.step_time_s:.3f} s, MFU {_pct(best.mfu)}; its bottleneck is {best.bottleneck}.")
    if len(sr.ranked) > 1:
        second = sr.ranked[1]
        gap = 1.0 - second.tokens_per_s / best.tokens_per_s if best.tokens_per_s > 0 else 0.0
        out.append(f"Runner-up {second.plan}: {second.tokens_per_s:,.0f} tokens/s, "
                   f"{_pct(gap)} below the best.")
    unfit = [r.plan for r in sr.ranked if not r.fits_memory]
    if unfit:
        out.append(f"{len(unfit)} of the {len(sr.ranked)} plans do not fit in device memory: "
                   + "; ".join(unfit) + ".")
    return out


def _recorded(sr: SearchResult, trace_result: StepResult | None) -> dict[str, StepResult]:
    """Plan string -> a result of that plan that carries timeline segments."""
    out: dict[str, StepResult] = {}
    for r in [trace_result, *sr.ranked]:
        if r is not None and r.segments and r.plan not in out:
            out[r.plan] = r
    return out


def _context(sr: SearchResult, trace_result: StepResult | None, kind: str, has_trace: bool) -> dict:
    ranked = sr.ranked
    recorded = _recorded(sr, trace_result)
    timelines = []
    names = ("Simulated plan",) if kind == "simulation" else ("Best plan", "Runner-up")
    for i, (name, r) in enumerate(zip(names, ranked)):
        rec = recorded.get(r.plan)
        timelines.append({
            "heading": f"{name} (#{i + 1})", "plan": r.plan,
            "gantt": plots.gantt(rec, f"#{i + 1}: step {rec.step_time_s:.3f} s") if rec else None,
            "note": None if rec else "this result was simulated without recording its timeline",
            "memory": plots.memory_bars(r, f"Memory per device, #{i + 1}"),
            "devices": [{"rank": d.rank, "stage": d.stage, "gpu": d.gpu, "represents": d.represents,
                         "parts": ", ".join(f"{k} {v:.1f}" for k, v in d.memory_gib.items()),
                         "peak": f"{d.peak_memory_gib:.1f}", "capacity": f"{d.capacity_gib:.0f}",
                         "fits": "yes" if d.fits_memory else "NO"} for d in r.devices],
        })
    tps, pps, vals, notes = tp_pp_grid(ranked)
    heat_rows = [[f"pp={p}"] + [notes[i][j] if v != v else f"{v:,.0f}" for j, v in enumerate(vals[i])]
                 for i, p in enumerate(pps)]
    groups = device_groups(ranked)
    group_rows = []
    for i, r in enumerate(ranked):
        util = group_utilisation(r)
        group_rows.append([f"#{i + 1}", r.plan] + [_pct(util[g]) if g in util else "" for g in groups])
    best = ranked[0] if ranked else None
    links = [{"link": row["link"], "kind": row.get("kind", ""), "gb": f"{row['bytes'] / 1e9:.2f}",
              "util": _pct(row["utilisation"])} for row in (best.busiest_links if best else [])]
    breakdown_rows = [[f"#{i + 1}", r.plan] + [f"{r.breakdown.get(c, 0.0):.3f}" for c in CATEGORIES]
                      for i, r in enumerate(ranked)]
    for t in timelines:
        keys = ("rank", "stage", "gpu", "represents", "parts", "peak", "capacity", "fits")
        t["device_cells"] = [[d[k] for k in keys] for d in t["devices"]]
    titles = {"simulation": "plansim simulation report", "search": "plansim search report",
              "comparison": "plansim plan comparison"}
    return {
        "title": titles[kind], "kind": kind, "sr": sr, "findings": findings(sr, single=kind == "simulation"),
        "ranked": ranked_rows(ranked), "ranked_headers": RANKED_HEADERS,
        "pruned": list(sr.pruned.items()), "pruned_examples": sr.pruned_examples,
        "breakdown_img": plots.breakdown_bars(ranked) if ranked else None,
        "breakdown_rows": breakdown_rows, "categories": CATEGORIES,
        "timelines": timelines,
        # One (tp, pp) shape among all plans makes a one-cell map: nothing to compare.
        "heatmap_img": plots.tp_pp_heatmap(ranked) if len(tps) * len(pps) > 1 else None,
        "heat_headers": ["", *[f"tp={t}" for t in tps]], "heat_rows": heat_rows,
        "groups": groups, "group_rows": group_rows,
        "group_img": plots.group_utilisation_bars(ranked, groups) if len(groups) > 1 else None,
        "ranked_header_names": [h for _, h in RANKED_HEADERS],
        "ranked_cells": [[row[k] for k, _ in RANKED_HEADERS] for row in ranked_rows(ranked)],
        "pruned_cells": [[why, n, sr.pruned_examples.get(why, "")] for why, n in sr.pruned.items()],
        "link_cells": [[f"`{x['link']}`", x["kind"], x["gb"], x["util"]] for x in links],
        "links": links, "best": best, "trace": TRACE if has_trace else None,
    }


def _markdown_table(headers: list[str], rows: list[list]) -> str:
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def render(sr: SearchResult, trace_result: StepResult | None = None, kind: str | None = None,
           has_trace: bool = False) -> dict[str, bytes]:
    """File name -> bytes of index.html, report.md and plans.csv (nothing is written)."""
    kind = kind or ("search" if sr.candidates else "comparison")
    ctx = _context(sr, trace_result, kind, has_trace)
    env = _env()
    env.globals["md_table"] = _markdown_table
    return {
        "index.html": env.get_template("report.html.j2").render(**ctx).encode("utf-8"),
        "report.md": env.get_template("report.md.j2").render(**ctx).encode("utf-8"),
        "plans.csv": plans_csv(sr.ranked).encode("utf-8"),
    }


def _trace_source(sr: SearchResult, trace_result: StepResult | None) -> StepResult | None:
    if trace_result is not None and trace_result.segments:
        return trace_result
    if sr.ranked and sr.ranked[0].segments:
        return sr.ranked[0]
    return None


def _write(out_dir: str | Path, sr: SearchResult, trace_result: StepResult | None,
           kind: str | None) -> list[Path]:
    out = output_dir(out_dir)
    trace_src = _trace_source(sr, trace_result)
    files = render(sr, trace_result, kind, has_trace=trace_src is not None)  # may fail: nothing written yet
    if trace_src is not None:
        files = {**{name: files[name] for name in FILES}, TRACE: trace_bytes(trace_src)}
    return write_files(out, files)


def write_report(out_dir: str | Path, search_result: SearchResult,
                 trace_result: StepResult | None = None) -> list[Path]:
    """Write index.html, report.md, plans.csv and trace.json comparing the ranked plans.

    The trace (and the best plan's timeline) come from `trace_result` when given, else
    from the best plan when it was simulated with record=True. Returns the paths written.
    """
    return _write(out_dir, search_result, trace_result, None)


def write_simulation_report(out_dir: str | Path, result: StepResult) -> list[Path]:
    """The same report for one simulated plan (what `plansim simulate --report` writes)."""
    sr = SearchResult(topology=result.topology, model=result.model, num_devices=result.num_devices,
                      ranked=[result], pruned={})
    return _write(out_dir, sr, result, "simulation")
