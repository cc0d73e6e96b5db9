"""Calibration from live runs: fit a few profile parameters to measured step times of real
training runs, and say by k-fold cross-validation how well the fitted profile predicts runs
it did not see (`plansim calibrate --runs RUNS.csv --out PROFILE.yaml`).

The rows are read and simulated exactly as `plansim accuracy` does (validate/accuracy.py:
``load_rows``, ``row_profile``, ``simulate_row``). Fitted, per GPU type present: the GEMM
ceiling ``gemm_eff_max`` and the HBM share ``hbm_eff``; per link class present: ``bw_eff``
of the intra-node fabric and of the inter-node network. Other parameters are left as
bundled: attention_eff only prices fused (flash) attention (costmodel/efficiency.py), and
doubling host_overhead_us or kernel_overhead_us moved no bundled row's step time by 1 %
(measured on validate/data/published_runs.csv, 2026-11-30), so step times cannot identify them.

Speed and honesty. One simulation of a large row takes seconds, so the optimiser never
simulates. Per row, a fixed design that does not look at any measured figure, the start
point and one probe per parameter (the parameter times ``PROBE``), gives a surrogate

    t(theta) = c0 + sum_j c_j / theta_j

(the compute time of a kernel scales with 1/efficiency, a transfer's with 1/bw_eff; c_j from
the probe's secant). scipy.optimize.least_squares fits the training rows' surrogates to
their measured figures within physical bounds. Every reported error is a real simulation:
each held-out row is simulated with the profile fitted on the other folds. The surrogate's
own error at those points is reported beside it.
"""
from __future__ import annotations

import math
import os
import random
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

import yaml

from costmodel.errors import InputError
from costmodel.limits import number_problem
from costmodel.profile import PROFILE_MAPPING, Profile, default_profile
from costmodel.yamlio import bundled_file, bundled_names, decode, load_yaml_mapping, parse_yaml
from validate.accuracy import (RunRow, load_rows, mape, row_cluster, row_profile,
                               simulate_row)

# A probe sets one parameter to this multiple of its start value (clipped to its bounds):
# far enough that its secant spans the range fits land in, near enough to stay physical.
PROBE = 0.6
# GEMM and HBM efficiencies (assumed bounds): no kernel sustains its datasheet peak, and
# below 20 % the profile would describe a broken machine rather than an inefficient one.
EFF_BOUNDS = (0.2, 0.95)
# Achievable bus bandwidth over line rate: below the line rate (NCCL reaches about 192 of
# 200 GB/s all-reduce busbw on 8 x HDR, 0.96, docs/facts.md); the low end admits transfers
# staged through host memory (the bundled Omni-Path fit is 0.17, costmodel/profiles/a100-opa.yaml).
BW_BOUNDS = (0.05, 0.97)


@dataclass(frozen=True)
class FitParam:
    """One fitted number of the profile: ``section`` ('gpus' or 'fabrics'), ``key`` (GPU
    type or link class) and ``field`` of that entry, with its physical bounds."""

    section: str
    key: str
    field: str
    lower: float
    upper: float

    @property
    def name(self) -> str:
        return f"{self.section}.{self.key}.{self.field}"

    def get(self, profile: Profile) -> float:
        entry = profile.gpu(self.key) if self.section == "gpus" else profile.fabric(self.key)
        return float(getattr(entry, self.field))

    def probe(self, start: float) -> float:
        """Where the surrogate's secant is taken: start x PROBE, or start / PROBE where that
        would leave the bounds (a start at the lower bound)."""
        down = start * PROBE
        return down if down >= self.lower else min(start / PROBE, self.upper)

    def generic(self) -> float:
        """The generic default of this parameter: the ``default`` GPU entry or the default
        fabric of costmodel/profiles/default.yaml, i.e. before any fit to measured runs."""
        base = default_profile()
        entry = base.gpus["default"] if self.section == "gpus" else base.fabrics["default"]
        return float(getattr(entry, self.field))


def with_values(profile: Profile, params: Sequence[FitParam], values: Sequence[float]) -> Profile:
    """``profile`` with each parameter set to its value (other fields untouched)."""
    gpus, fabrics = dict(profile.gpus), dict(profile.fabrics)
    for p, v in zip(params, values):
        if p.section == "gpus":
            gpus[p.key] = replace(profile.gpu(p.key) if p.key not in gpus else gpus[p.key], **{p.field: float(v)})
        else:
            fabrics[p.key] = replace(fabrics.get(p.key) or profile.fabric(p.key), **{p.field: float(v)})
    return replace(profile, gpus=gpus, fabrics=fabrics)


def fit_params(rows: Sequence[RunRow], src: str) -> list[FitParam]:
    """The named parameters these rows can inform, in a stable order: gemm_eff_max and
    hbm_eff per GPU type, bw_eff of each intra-node link class, and of 'network' when a row
    spans nodes. InputError (from row_cluster) names a row whose GPU does not match its
    network's topology."""
    gpus: set[str] = set()
    links: set[str] = set()
    for row in rows:
        cluster = row_cluster(row, src)
        gpus.add(row.gpu)
        links.update(n.intra_kind for n in cluster.nodes)
        if len(cluster.nodes) > 1:
            links.add("network")
    out = [FitParam("gpus", g, f, *EFF_BOUNDS) for g in sorted(gpus) for f in ("gemm_eff_max", "hbm_eff")]
    return out + [FitParam("fabrics", k, "bw_eff", *BW_BOUNDS) for k in sorted(links)]


# ------------------------------------------------------------------ folds and surrogate
def fold_of(n_rows: int, folds: int, seed: int = 0) -> list[int]:
    """Fold index of each row: a seeded shuffle dealt round-robin, so every row is in
    exactly one fold and fold sizes differ by at most one."""
    problem = number_problem(folds, 2, n_rows, integer=True)
    if problem:
        raise InputError("--folds", None, f"{folds!r}: {problem} (at most the number of rows)")
    order = list(range(n_rows))
    random.Random(seed).shuffle(order)
    out = [0] * n_rows
    for k, i in enumerate(order):
        out[i] = k % folds
    return out


@dataclass(frozen=True)
class Surrogate:
    """t(theta) = c0 + sum_j c_j / theta_j for one row, t the row's time-like figure
    (seconds per step; 1/figure for a throughput figure)."""

    c0: float
    c: tuple[float, ...]

    @classmethod
    def from_probes(cls, theta0: Sequence[float], t0: float, probes: Sequence[tuple[float, float]]) -> "Surrogate":
        """From the time at theta0 and, per parameter, (probe value, time there)."""
        c = tuple((tj - t0) / (1.0 / vj - 1.0 / th) if vj != th else 0.0
                  for th, (vj, tj) in zip(theta0, probes))
        return cls(t0 - sum(cj / th for cj, th in zip(c, theta0)), c)

    def __call__(self, theta: Sequence[float]) -> float:
        return self.c0 + sum(cj / th for cj, th in zip(self.c, theta))


def _to_time(figure: float, kind: str) -> float:
    return figure if kind == "iter_time_s" else 1.0 / figure


def _from_time(t: float, kind: str) -> float:
    return t if kind == "iter_time_s" else 1.0 / max(t, 1e-30)


def fit_surrogates(surrogates: Sequence[Surrogate], measured: Sequence[float], kinds: Sequence[str],
                   params: Sequence[FitParam], theta0: Sequence[float]) -> list[float]:
    """Parameter values minimising the squared relative errors of the surrogates'
    predictions against the measured figures, within each parameter's bounds."""
    try:
        from scipy.optimize import least_squares
    except ImportError:  # scipy comes with the validate extra
        raise InputError("--runs", None, "calibrating from runs needs scipy: pip install 'plansim[validate]'") from None
    lo = [p.lower for p in params]
    hi = [p.upper for p in params]

    def residuals(theta):
        return [(_from_time(s(theta), k) - m) / m for s, m, k in zip(surrogates, measured, kinds)]

    x0 = [min(max(t, a), b) for t, a, b in zip(theta0, lo, hi)]
    sol = least_squares(residuals, x0, bounds=(lo, hi), method="trf", x_scale=[b - a for a, b in zip(lo, hi)])
    return [float(x) for x in sol.x]


# ------------------------------------------------------------------ simulations
def _simulate(task: tuple) -> float:
    """The row's predicted figure under one profile (a process-pool task)."""
    row, profile, src = task
    return simulate_row(row, profile, src).predicted


def _run_all(tasks: list[tuple], jobs: int) -> list[float]:
    if jobs > 1 and len(tasks) > 1:
        from concurrent.futures import ProcessPoolExecutor
        with ProcessPoolExecutor(max_workers=min(jobs, len(tasks))) as pool:
            return list(pool.map(_simulate, tasks))
    return [_simulate(t) for t in tasks]


# ------------------------------------------------------------------ the fit
@dataclass
class RowFit:
    """One row in the cross-validation: measured figure, predictions (all simulated), and
    the surrogate's prediction at the held-out fit (for judging the surrogate)."""

    run_id: str
    fold: int
    figure_kind: str
    measured: float
    baseline: float  # simulated with the uncalibrated baseline profile
    calibrated: float  # simulated with the profile fitted on the other folds
    surrogate: float  # the surrogate's prediction at that same profile
    bundled: float | None = None  # simulated with the bundled profiles as shipped

    def error(self, which: str) -> float:
        return (getattr(self, which) - self.measured) / self.measured

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("run_id", "fold", "figure_kind", "measured", "baseline", "calibrated",
                                           "surrogate", "bundled")}
        d.update({f"error_{k}": self.error(k) for k in ("baseline", "calibrated") + (("bundled",) if self.bundled else ())})
        return d


@dataclass
class RunsFit:
    """The result of ``calibrate_from_runs``: the fitted parameters (on all rows) and the
    k-fold cross-validation of the same procedure."""

    rows_file: str
    params: dict[str, float]  # name -> fitted on all rows
    specs: list[FitParam]
    baseline_values: dict[str, float]  # name -> value in the uncalibrated baseline ('' rows differ)
    bundled_values: dict[str, str]  # name -> value(s) in the bundled profiles, by network
    baseline: str  # what the uncalibrated baseline is, in words
    rows: list[RowFit]
    folds: int
    seed: int
    fold_params: list[dict[str, float]]  # per fold, fitted on the other folds
    base_profile: str | None = None
    created_utc: str = ""
    wall_s: float = 0.0
    simulations: int = 0
    notes: list[str] = field(default_factory=list)

    def mape(self, which: str, fold: int | None = None) -> float:
        """Mean |relative error| (fraction) over all rows, or over one fold's held-out rows."""
        return mape([r.error(which) for r in self.rows if fold is None or r.fold == fold])

    def summary(self) -> dict:
        """Held-out MAPE per fold and overall, baseline vs calibrated (fractions)."""
        out = {
            "rows_file": self.rows_file, "rows": len(self.rows), "folds": self.folds, "seed": self.seed,
            "baseline": self.baseline, "base_profile": self.base_profile,
            "params": {p.name: {"baseline": _finite_or_none(self.baseline_values[p.name]), "bundled": self.bundled_values[p.name],
                                "fitted": self.params[p.name], "bounds": [p.lower, p.upper]} for p in self.specs},
            "cv_mape_baseline": self.mape("baseline"), "cv_mape_calibrated": self.mape("calibrated"),
            "cv_mape_surrogate_vs_simulation": mape([(r.surrogate - r.calibrated) / r.calibrated for r in self.rows]),
            "per_fold": [{"fold": f, "rows": [r.run_id for r in self.rows if r.fold == f],
                          "mape_baseline": self.mape("baseline", f), "mape_calibrated": self.mape("calibrated", f),
                          "params": self.fold_params[f]} for f in range(self.folds)],
            "per_row": [r.to_dict() for r in self.rows],
            "simulations": self.simulations, "wall_s": self.wall_s, "created_utc": self.created_utc,
            "notes": list(self.notes),
        }
        if all(r.bundled is not None for r in self.rows):
            out["mape_bundled"] = self.mape("bundled")
        return out

    def profile_mapping(self) -> dict:
        """The fitted profile as a mapping in the bundled profiles' schema, to be merged over
        each run's bundled profiles (``--profile``); with a base profile, over that too."""
        out: dict = _overlay(self.base_profile) if self.base_profile else {}
        day = self.created_utc[:10]
        ids = [r.run_id for r in self.rows]
        out["name"] = "runs-fit"
        out["source"] = (f"plansim calibrate --runs {self.rows_file} on {self.created_utc}"
                         + (f", over {self.base_profile}" if self.base_profile else "")
                         + f": {self.folds}-fold CV (seed {self.seed}) held-out MAPE "
                         f"{100 * self.mape('calibrated'):.1f} % vs {100 * self.mape('baseline'):.1f} % for the "
                         f"uncalibrated baseline ({self.baseline})")
        for section in ("gpus", "fabrics"):
            keys = sorted({p.key for p in self.specs if p.section == section})
            for key in keys:
                mine = [p for p in self.specs if p.section == section and p.key == key]
                entry = dict((out.get(section) or {}).get(key) or {})
                entry.update({p.field: round(self.params[p.name], 4) for p in mine})
                names = ", ".join(p.field for p in mine)
                entry["source"] = (
                    f"{names}: FIT on {day} (plansim validate/fit_runs.py, scipy least_squares within bounds "
                    f"{', '.join(f'{p.field} [{p.lower}, {p.upper}]' for p in mine)}, on a per-row surrogate "
                    f"from simulations) to the measured figures of {len(ids)} rows of {self.rows_file} "
                    f"({', '.join(ids)}); held-out error in this profile's source. Other fields as bundled.")
                out.setdefault(section, {})[key] = entry
        return out

    def profile_yaml(self) -> str:
        return ("# Written by `plansim calibrate --runs`; use it with --profile (merged over each run's\n"
                "# bundled profiles). Every fitted number's source says to which rows, by what and when.\n"
                + yaml.safe_dump(self.profile_mapping(), sort_keys=False, width=100))


def _finite_or_none(v: float) -> float | None:
    return v if math.isfinite(v) else None  # JSON has no NaN


def _overlay(base_profile: str) -> dict:
    """The raw mapping of a base profile file or bundled profile (what it sets, not merged)."""
    if Path(base_profile).is_file():
        data = load_yaml_mapping(base_profile, base_profile, "profile file", PROFILE_MAPPING)
    else:
        res = bundled_file("costmodel", base_profile, "profiles")
        if res is None:
            raise InputError(base_profile, "--profile", f"no bundled profile or file named {base_profile!r}; "
                             f"bundled: {', '.join(bundled_names('costmodel', 'profiles'))}")
        data = parse_yaml(decode(res.read_bytes(), base_profile), base_profile)
    src = base_profile
    data = data or {}
    if not isinstance(data, dict):
        raise InputError(src, None, "expected a profile mapping")
    return data


DEFAULT_FOLDS = 5


def check_folds(n_rows: int, folds: int | None, src: str) -> int:
    """The k of the k-fold cross-validation over ``n_rows`` rows of ``src``: ``folds``, or
    min(DEFAULT_FOLDS, rows) when not given. InputError (one line) when the file has fewer than
    2 rows, or ``folds`` is not in [2, rows]."""
    if n_rows < 2:
        raise InputError(src, "--runs", f"k-fold cross-validation needs at least 2 rows; the file has {n_rows}")
    if folds is None:
        return min(DEFAULT_FOLDS, n_rows)
    if number_problem(folds, 2, n_rows, integer=True):
        bound = f"at most {n_rows} (rows in {src})" if isinstance(folds, int) and folds > n_rows else \
            f"an integer in [2, {n_rows}] ({n_rows} rows in {src})"
        raise InputError("--folds", None, f"{str(folds)[:60]}: must be {bound}")
    return folds


def calibrate_from_runs(runs_csv: str | Path | None, *, folds: int | None = DEFAULT_FOLDS, seed: int = 0,
                        base_profile: str | None = None, jobs: int | None = None) -> RunsFit:
    """Fit ``fit_params`` of the rows to their measured figures and cross-validate.

    Baseline (uncalibrated): without ``base_profile``, each row's bundled profiles with every
    fitted parameter at its generic default (the ``default`` GPU entry and default fabric of
    default.yaml), i.e. before the bundled fits to these rows; the bundled profiles as shipped
    are simulated too, for reference. With ``base_profile`` (a file or bundled name, merged
    over each row's profiles as ``--profile`` is), that profile is the baseline and the start.
    ``jobs``: processes to simulate in (default: the CPU count, at most 4, as `plansim accuracy`).
    """
    t_start = time.perf_counter()
    src = str(runs_csv) if runs_csv else "validate/data/published_runs.csv"
    rows = load_rows(runs_csv)
    folds = check_folds(len(rows), folds, src)
    k = fold_of(len(rows), folds, seed)
    if jobs is None:
        jobs = min(os.cpu_count() or 1, 4)
    problem = number_problem(jobs, 1, math.inf, integer=True, hi_open=True)
    if problem:
        raise InputError("--jobs", None, f"{jobs!r}: {problem}")
    specs = fit_params(rows, src)
    bundled = [row_profile(r, None) for r in rows]
    if base_profile:
        starts = [row_profile(r, base_profile) for r in rows]
        baseline = f"each row's bundled profiles with {base_profile} merged over them"
    else:
        starts = [with_values(b, specs, [p.generic() for p in specs]) for b in bundled]
        baseline = ("generic defaults: each row's bundled profiles with "
                    + ", ".join(f"{p.name} = {p.generic():g}" for p in specs)
                    + " (default.yaml's 'default' GPU entry and default fabric)")
    theta0 = [[p.get(s) for p in specs] for s in starts]
    probes = [[p.probe(th) for p, th in zip(specs, t0)] for t0 in theta0]

    # Wave 1: start point and probes per row (no measured figure involved), plus the bundled
    # profiles as shipped for reference.
    tasks = []
    for i, row in enumerate(rows):
        tasks.append((row, starts[i], src))
        for j in range(len(specs)):
            v = list(theta0[i])
            v[j] = probes[i][j]
            tasks.append((row, with_values(starts[i], specs, v), src))
        if not base_profile:
            tasks.append((row, bundled[i], src))
    got = iter(_run_all(tasks, jobs))
    base_pred, bundled_pred, surrogates, row_probe = [], [], [], []
    for i, row in enumerate(rows):
        y0 = next(got)
        ys = [next(got) for _ in specs]
        row_probe.append(ys)
        bundled_pred.append(next(got) if not base_profile else None)
        base_pred.append(y0)
        surrogates.append(Surrogate.from_probes(
            theta0[i], _to_time(y0, row.figure_kind),
            [(probes[i][j], _to_time(ys[j], row.figure_kind)) for j in range(len(specs))]))

    # A parameter no row's figure moves with (under 0.1 % at its probe) cannot be fitted:
    # leave it out (it keeps its start value) rather than write an arbitrary number.
    moves = [max(abs(ys - y0) / y0 for y0, ys in ((base_pred[i], row_probe[i][j]) for i in range(len(rows))))
             for j in range(len(specs))]
    keep = [j for j, m in enumerate(moves) if m >= 1e-3]
    notes = [f"{specs[j].name} not fitted: no row's figure changes by 0.1 % when it moves from "
             f"{theta0[0][j]:g} to {probes[0][j]:g}" for j in range(len(specs)) if j not in keep]
    if not keep:
        raise InputError(src, None, "no parameter in " + ", ".join(p.name for p in specs)
                         + " changes any row's figure; nothing to fit")
    if len(keep) < len(specs):
        surrogates = [Surrogate(s.c0 + sum(s.c[j] / theta0[i][j] for j in range(len(specs)) if j not in keep),
                                tuple(s.c[j] for j in keep)) for i, s in enumerate(surrogates)]
        specs = [specs[j] for j in keep]
        theta0 = [[t[j] for j in keep] for t in theta0]
    measured = [r.figure for r in rows]
    kinds = [r.figure_kind for r in rows]
    x0 = [sorted(col)[len(col) // 2] for col in zip(*theta0)]

    def fit(idx: list[int]) -> list[float]:
        return fit_surrogates([surrogates[i] for i in idx], [measured[i] for i in idx], [kinds[i] for i in idx],
                              specs, x0)

    fold_theta = [fit([i for i in range(len(rows)) if k[i] != f]) for f in range(folds)]
    # Wave 2: every row simulated with the profile fitted without its fold.
    held = _run_all([(row, with_values(starts[i], specs, fold_theta[k[i]]), src) for i, row in enumerate(rows)], jobs)
    theta_all = fit(list(range(len(rows))))

    out_rows = [RowFit(run_id=r.run_id, fold=k[i], figure_kind=r.figure_kind, measured=r.figure,
                       baseline=base_pred[i], calibrated=held[i],
                       surrogate=_from_time(surrogates[i](fold_theta[k[i]]), r.figure_kind), bundled=bundled_pred[i])
                for i, r in enumerate(rows)]
    base_vals = {p.name: (theta0[0][j] if len({t[j] for t in theta0}) == 1 else float("nan"))
                 for j, p in enumerate(specs)}
    bundled_vals = {}
    for j, p in enumerate(specs):
        by_net: dict[str, float] = {}
        for r, b in zip(rows, bundled):
            by_net.setdefault(r.network, p.get(b))
        vals = sorted(set(by_net.values()))
        bundled_vals[p.name] = (f"{vals[0]:g}" if len(vals) == 1 else
                                ", ".join(f"{v:g} ({n})" for n, v in sorted(by_net.items())))
    nets = sorted({r.network for r in rows if r.nodes > 1})
    if len(nets) > 1 and any(p.key == "network" for p in specs):
        notes.append(f"fabrics.network.bw_eff is one value for all rows' networks ({', '.join(nets)}): the profile "
                     "schema keys fabrics by link class; calibrate each cluster's rows separately for per-cluster values")
    return RunsFit(rows_file=src, params={p.name: v for p, v in zip(specs, theta_all)}, specs=specs,
                   baseline_values=base_vals, bundled_values=bundled_vals, baseline=baseline, rows=out_rows,
                   folds=folds, seed=seed, fold_params=[{p.name: v for p, v in zip(specs, th)} for th in fold_theta],
                   base_profile=base_profile, created_utc=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                   wall_s=time.perf_counter() - t_start, simulations=len(tasks) + len(held), notes=notes)


def format_summary(fit: RunsFit) -> str:
    """The table `plansim calibrate --runs` prints: parameters (baseline, bundled, fitted,
    bounds), then held-out MAPE per fold and overall, baseline vs calibrated."""
    from tabulate import tabulate

    def num(v):
        return "differs by row" if isinstance(v, float) and math.isnan(v) else f"{v:.3f}"

    def at_bound(p):  # the data push it past physical: the bound, not the rows, set it
        return min(abs(fit.params[p.name] - p.lower), abs(fit.params[p.name] - p.upper)) < 1e-6

    def spread(name):  # how much the fit moves when one fold is left out: its stability
        vals = [fp[name] for fp in fit.fold_params]
        return f"{min(vals):.3f}-{max(vals):.3f}"

    params = tabulate([[p.name, num(fit.baseline_values[p.name]), fit.bundled_values[p.name],
                        f"{fit.params[p.name]:.3f}" + (" (at bound)" if at_bound(p) else ""), spread(p.name), f"[{p.lower:g}, {p.upper:g}]"] for p in fit.specs],
                      headers=["parameter", "baseline", "bundled", "fitted (all rows)", "fold fits", "bounds"],
                      tablefmt="simple", disable_numparse=True)
    def held(f):  # the fold's rows: their ids when few (leave-one-out), else their count
        ids = [r.run_id for r in fit.rows if r.fold == f]
        return ids[0] if len(ids) == 1 else str(len(ids))

    folds = tabulate([[f, held(f), f"{100 * fit.mape('baseline', f):.1f} %",
                       f"{100 * fit.mape('calibrated', f):.1f} %"] for f in range(fit.folds)],
                     headers=["fold", "held-out rows", "MAPE baseline", "MAPE calibrated"],
                     tablefmt="simple", disable_numparse=True)
    mb, mc = fit.mape("baseline"), fit.mape("calibrated")
    better = (f"{100 * (mb - mc):.1f} points better ({mb / mc:.1f}x lower)" if mc < mb and mc > 0 else
              f"{100 * (mb - mc):.1f} points better" if mc < mb else f"{100 * (mc - mb):.1f} points WORSE")
    lines = [params, "", folds, "",
             f"held-out MAPE over {len(fit.rows)} rows, {fit.folds}-fold CV (seed {fit.seed}): "
             f"baseline {100 * mb:.1f} % -> calibrated {100 * mc:.1f} %: {better}",
             f"baseline (uncalibrated): {fit.baseline}"]
    if all(r.bundled is not None for r in fit.rows):
        lines.append(f"for reference, the bundled profiles as shipped (partly fitted to published rows): "
                     f"MAPE {100 * fit.mape('bundled'):.1f} %")
    sur = mape([(r.surrogate - r.calibrated) / r.calibrated for r in fit.rows])
    lines.append(f"every error above is a full simulation; the surrogate the fit optimises is off the simulation "
                 f"by {100 * sur:.2f} % (mean) at the held-out points")
    lines += [f"note: {n}" for n in fit.notes]
    lines.append(f"{fit.simulations} simulations in {fit.wall_s:.0f} s")
    return "\n".join(lines)
