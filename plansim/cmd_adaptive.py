"""`plansim validate-adaptive`: a real run with one slow rank, rebalanced by the adaptive
controller (costmodel/rebalance.py), beside the same runs unslowed and with a fixed split,
and the simulator's prediction of each.

    plansim validate-adaptive localhost-cpu --slow-rank 1:0.5 [--mode dp|pp] [--steps N]
        [--profile FILE] [--out RECORD.json] [--json]

The work is in validate/adaptive_run.py (the runs) and validate/adaptive_figures.py (the
figures and the prediction); this module only parses, calls and prints.
"""
from __future__ import annotations

import json
import sys

from costmodel.errors import InputError


def register(subparsers) -> None:
    p = subparsers.add_parser("validate-adaptive",
                              help="real run with a slow rank, rebalanced by the adaptive controller")
    p.add_argument("topology", help="bundled topology name or YAML path of this host (e.g. localhost-cpu)")
    p.add_argument("--model", default="tiny", help="model preset or YAML (default tiny)")
    p.add_argument("--mode", choices=("dp", "pp"), default="dp",
                   help="dp: samples per data-parallel rank; pp: layers per pipeline stage (default dp)")
    p.add_argument("--world", type=int, default=2, help="processes (default 2)")
    p.add_argument("--slow-rank", default="1:0.5", metavar="R:F",
                   help="rank R computes at speed F in (0, 1] (default 1:0.5, half speed)")
    p.add_argument("--slow-by", choices=("quota", "work"), default=None,
                   help="quota: the slow rank pauses (1/F - 1) x its measured compute (default for dp); "
                        "work: it runs 1/F - 1 extra forward+backward passes (the only one for pp)")
    p.add_argument("--mbs", type=int, default=None,
                   help="samples per microbatch: the dp unit (default 1); pp microbatch size (default 4)")
    p.add_argument("--steps", type=int, default=16, help="measured steps per run (default 16)")
    p.add_argument("--warmup", type=int, default=2, help="unmeasured steps first (default 2)")
    p.add_argument("--settle", type=int, default=4,
                   help="measured steps left out of the medians while the controller converges (default 4)")
    p.add_argument("--profile", help="calibrated profile (plansim calibrate TOPOLOGY --world N) for the prediction")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before the runs are abandoned")
    p.add_argument("--out", help="write the record of the three runs, figures and predictions (JSON)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_validate_adaptive)


def _cluster_profile(args):
    """The one-host cluster of --world devices and the profile, checked before any run."""
    from costmodel.profile import load_profile
    from plansim.cmd_calibrate import resolve_world
    cluster, _ = resolve_world(args.topology, args.world)
    return cluster, load_profile(args.profile, bundled=cluster.profiles)


def _predict(args, model, runs: dict, cluster, profile) -> dict:
    """Per-step simulated times of each run (the allocation it used, under its
    scenario) and the simulator's own adaptive run; their agreement with the measured."""
    from validate.adaptive_figures import predict_adaptive, predict_replay, sim_agreement
    out = {}
    for name, rec in runs.items():
        pred = predict_replay(model, rec, cluster, profile)
        out[name] = {"predicted_step_times_s": pred, **sim_agreement(rec.step_times_s, pred, args.settle)}
    times, units = predict_adaptive(model, runs["adaptive"], cluster, profile)
    out["simulated adaptive"] = {"predicted_step_times_s": times, "predicted_units": units,
                                 **sim_agreement(runs["adaptive"].step_times_s, times, args.settle)}
    # Each run relative to the unslowed one, predicted and measured: what the slowdown and
    # the rebalancing cost, free of the calibration's absolute error.
    base = out["unslowed"]
    for p in out.values():
        p["predicted_ratio"] = p["predicted_s"] / base["predicted_s"]
        p["measured_ratio"] = p["measured_s"] / base["measured_s"]
    return out


def _step_table(rec) -> str:
    lines = [f"{'step':>4} {'time ms':>8} {'allocation':>12} {'busy ms per rank':>20}  decision"]
    acts = {d["step"]: d for d in rec.decisions}
    for i, (t, u, b) in enumerate(zip(rec.step_times_s, rec.units, rec.busy_s)):
        d = acts.get(i)
        note = (d["reason"] if d and d["act"] else "keep") if d else ""
        busy = " ".join(f"{x * 1e3:.0f}" for x in b)
        lines.append(f"{i:>4} {t * 1e3:>8.1f} {':'.join(map(str, u)):>12} {busy:>20}  {note}")
    for m in rec.migrations:
        lines.append(f"  moved after step {m['step']}: {m['from']} -> {m['to']}, {m['bytes'] / 1e6:.2f} MB "
                     f"in {m['seconds'] * 1e3:.1f} ms")
    return "\n".join(lines)


def check_flags(args) -> None:
    """The numeric flags in range, before anything is loaded or run: every step is a real
    step (bounded like `plansim validate --steps`), the timeout a finite positive number of
    seconds up to a day, a microbatch at least one sample, the seed what torch.manual_seed
    takes, and at least 2 processes (one slow rank beside others: its upper bound is the
    topology's node, checked by resolve_world)."""
    from costmodel.limits import MAX_DEVICES, MAX_GLOBAL_BATCH, MAX_SIM_STEPS, number_problem

    checks = [("--world", args.world, dict(lo=2, hi=MAX_DEVICES, integer=True)),
              ("--steps", args.steps, dict(lo=1, hi=MAX_SIM_STEPS, integer=True)),
              ("--warmup", args.warmup, dict(lo=0, hi=MAX_SIM_STEPS, integer=True)),
              ("--timeout", args.timeout, dict(lo=0.0, hi=86_400.0, lo_open=True)),
              ("--seed", args.seed, dict(lo=0, hi=2**63 - 1, integer=True))]
    if args.mbs is not None:
        checks.append(("--mbs", args.mbs, dict(lo=1, hi=MAX_GLOBAL_BATCH, integer=True)))
    for flag, value, bounds in checks:
        problem = number_problem(value, **bounds)
        if problem:
            raise InputError(flag, None, f"{str(value)[:60]}: {problem}")
    if not 0 <= args.settle < args.steps:
        raise InputError("--settle", None, f"must be in [0, steps) = [0, {args.steps}) (got {args.settle})")


def cmd_validate_adaptive(args) -> int:
    from specs.model import load_model
    from validate.adaptive_figures import figures, format_figures
    from validate.adaptive_run import AdaptiveConfig, check_configs, run_adaptive_many
    from validate.backend import require_torch
    from validate.slowdown import parse_slow_rank

    check_flags(args)
    rank, speed = parse_slow_rank(args.slow_rank, args.world)
    model = load_model(args.model)
    out_path = None
    if args.out is not None:
        from reports.files import output_file
        out_path = output_file(args.out, "--out", [("topology", args.topology), ("--model", args.model),
                                                    ("--profile", args.profile)])
    cluster, profile = _cluster_profile(args)
    mbs = args.mbs or (1 if args.mode == "dp" else 4)
    require_torch()
    base = dict(mode=args.mode, world=args.world, steps=args.steps, warmup=args.warmup, seed=args.seed, mbs=mbs,
                slow_by=args.slow_by)
    slow_by = AdaptiveConfig(**base).slow_mode
    cfgs = {"unslowed": AdaptiveConfig(**base, adaptive=False),
            "fixed": AdaptiveConfig(**base, slow_rank=rank, speed=speed, adaptive=False),
            "adaptive": AdaptiveConfig(**base, slow_rank=rank, speed=speed, adaptive=True)}
    check_configs(model, list(cfgs.values()))
    if not args.json:
        print(f"running {args.model} {args.mode} on {args.world} processes, rank {rank} at speed {speed:g} "
              f"(slowed by {slow_by}): "
              f"unslowed, fixed and adaptive runs of {args.warmup} + {args.steps} steps", file=sys.stderr, flush=True)
    runs = dict(zip(cfgs, run_adaptive_many(model, list(cfgs.values()), timeout_s=args.timeout)))
    figs = figures(runs["unslowed"], runs["fixed"], runs["adaptive"], args.settle)
    predicted = _predict(args, model, runs, cluster, profile)
    record = {"model": args.model, "mode": args.mode, "world": args.world, "slow_rank": rank, "speed": speed,
              "slow_by": slow_by,
              "profile": args.profile, "runs": {k: r.to_dict() for k, r in runs.items()},
              "figures": figs.to_dict(), "simulated": predicted}
    if out_path is not None:
        from reports.files import write_file
        write_file(out_path, json.dumps(record, indent=1).encode("utf-8"))  # atomic: no half-written record
    if args.json:
        print(json.dumps(record, indent=2))
        return 0
    print("adaptive run, per step:")
    print(_step_table(runs["adaptive"]))
    print(format_figures(figs))
    for name, p in predicted.items():
        what = ("simulator's adaptive run" if name == "simulated adaptive"
                else f"{name} allocations replayed")
        print(f"  {what:38s} {p['predicted_s'] * 1e3:8.1f} ms predicted vs {p['measured_s'] * 1e3:8.1f} ms measured: "
              f"{p['error_pct']:+.1f} % (median per-step {p['median_step_error_pct']:+.1f} %); x unslowed "
              f"{p['predicted_ratio']:.2f} predicted, {p['measured_ratio']:.2f} measured")
    if args.out:
        print(f"record written to {args.out}")
    return 0
