"""`plansim calibrate`: fit a hardware profile, from microbenchmarks or from run logs.

    plansim calibrate TOPOLOGY [--world N] [--model M] [--compute-from BENCH.json]
                      [--memory-model bandwidth|cache] [--stage-scales] --out PROFILE.yaml
    plansim calibrate --pool PROFILE.yaml PROFILE.yaml [...] [--memory-model M] [--stage-scales]
    plansim calibrate --runs RUNS.csv --out PROFILE.yaml [--folds K]

From microbenchmarks (validate/microbench.py, validate/calibrate.py): runs GEMMs,
memory-bound ops, tiny-op chains and collectives in N worker processes on this host at once
(as a plan with N processes would), fits the profile's efficiencies, overheads and the
intra-node link's bandwidth efficiency and call latency by least squares, prints the
measurements and residuals and writes the profile. It never runs a plan.

--pool refits profiles already calibrated on this host, each to its own record with the
compute samples of all their records pooled (validate/pool.py: e.g. --world 2's and --world
4's on a 2-core host, where both time compute in two processes at once), and rewrites them.

From run logs (validate/fit_runs.py): fits a small set of profile parameters to measured
step times of real training runs and reports the k-fold held-out error.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from costmodel.errors import InputError
from costmodel.profile import MEMORY_MODELS
from costmodel.limits import MAX_BENCH_REPEATS, MAX_COLLECTIVE_BYTES, MIN_COLLECTIVE_BYTES, number_problem

DEFAULT_MODEL = "tiny"


def register(subparsers) -> None:
    p = subparsers.add_parser("calibrate", help="fit a hardware profile from microbenchmarks or run logs")
    p.add_argument("topology", nargs="?", help="bundled topology name or YAML path (the host's device and link)")
    p.add_argument("--world", type=int, default=None,
                   help="worker processes measured at once (default: the topology's devices on its node)")
    p.add_argument("--model", default=None, help=f"model whose GEMM shapes to measure (default {DEFAULT_MODEL})")
    p.add_argument("--out", metavar="PROFILE.yaml", help="profile file to write")
    p.add_argument("--repeats", type=int, default=None, help="timed repeats per measurement (median taken; default 5)")
    p.add_argument("--max-bytes", type=int, default=None,
                   help="largest collective size in bytes (default 64 MiB)")
    p.add_argument("--quick", action="store_true",
                   help="small sweep (collectives to 1 MiB, GEMMs to 256, 3 repeats): a smoke test, not a calibration")
    p.add_argument("--compute-from", metavar="BENCH.json",
                   help="take the compute microbenchmarks from another calibration's record (P.bench.json) "
                        "measured under the same conditions (processes at once, threads, cores), e.g. --world 4's "
                        "for --world 2 on a 2-core host; only the collectives are measured")
    p.add_argument("--memory-model", choices=MEMORY_MODELS, default=MEMORY_MODELS[0],
                   help="element-wise ops: one bandwidth for every op (default), or the longer of their "
                        "traffic and their arithmetic with a cache level (docs/validation-cpu.md mechanism 52: "
                        "better on a host whose vector math is slow, worse on the three others tried)")
    p.add_argument("--stage-scales", action="store_true",
                   help="multiply the model's forward, backward and Adam by the ratios measured on its own "
                        "stage, as the runner trains it, over their price (docs/validation-cpu.md mechanism 57: "
                        "Adam priced 2-10x high on one host type, but the plans predicted no better there); "
                        "measured either way and kept in the .bench.json")
    p.add_argument("--pool", nargs="+", metavar="PROFILE.yaml",
                   help="refit these calibrated profiles (each with its .bench.json beside it), each to its own "
                        "record with every record's compute samples pooled, and rewrite them; the records must "
                        "have timed compute under the same conditions (docs/validation-cpu.md mechanism 58)")
    p.add_argument("--json", action="store_true", help="print the measurements and the fit as one JSON object")
    p.add_argument("--runs", metavar="RUNS.csv", help="fit to measured step times of training runs instead")
    p.add_argument("--folds", type=int, default=None,
                   help="with --runs: k of the k-fold cross-validation (default 5, or the rows when fewer)")
    p.set_defaults(func=cmd_calibrate)


def _profile_text(path: str, mapping: dict) -> str:
    return ("# Written by `plansim calibrate`; load it with --profile " + Path(path).name + "\n"
            + yaml.safe_dump(mapping, sort_keys=False, width=100))


def _write_text(path: str, text: str) -> None:
    """Atomically (reports.files: a unique temporary beside the target, then a rename)."""
    from reports.files import write_file
    write_file(Path(path), text.encode("utf-8"))


def _from_runs(args) -> int:
    from reports.files import check_outputs
    from validate.fit_runs import calibrate_from_runs, format_summary
    # Checked before the (long) fit: writable, and not the runs file it reads.
    check_outputs([("--out", args.out, None)], [("--runs", args.runs)])
    fit = calibrate_from_runs(args.runs, folds=args.folds)
    _write_text(args.out, fit.profile_yaml())
    if args.json:
        print(json.dumps(fit.summary(), indent=2))
    else:
        print(format_summary(fit))
        print(f"profile written to {args.out}")
    return 0


def resolve_world(topology: str, world: int | None, flag: str = "--world", what: str = ""):
    """The one-host cluster of ``world`` devices the validator runs on: one node of the
    topology's (single) node type. InputError names the allowed range, 1 .. that node's
    devices."""
    from specs.topology import load_topology
    full = load_topology(topology)
    if len(full.groups()) != 1:
        raise InputError(topology, "--world", f"the validator runs on one host of one node type; {full.name} "
                         f"has {len(full.groups())} groups")
    most = full.gpus_per_node
    if world is None:
        world = most
    problem = number_problem(world, 1, most, integer=True)
    if problem:
        raise InputError(topology, flag, f"{what}{world}: {problem} (devices of one {full.name} node)")
    return load_topology(topology, nodes=1, gpus_per_node=world), world


def _pool(args) -> int:
    """--pool: refit the profiles on their pooled compute and rewrite them together."""
    for flag, given in (("TOPOLOGY", args.topology), ("--world", args.world), ("--model", args.model),
                        ("--out", args.out), ("--compute-from", args.compute_from), ("--repeats", args.repeats),
                        ("--max-bytes", args.max_bytes), ("--quick", args.quick or None), ("--json", args.json or None)):
        if given is not None:
            raise InputError(flag, None, "does not apply to --pool (it refits the profiles given, measuring nothing)")
    from reports.files import output_file, write_files
    from validate.pool import pool_profiles
    from validate.profile_file import format_params
    for p in args.pool:  # each rewritten in place: it must be a writable file
        output_file(p, "--pool", [])
    done = pool_profiles(args.pool, args.memory_model, args.stage_scales)
    folders: dict[Path, dict[str, bytes]] = {}
    for p, _, mapping in done:
        folders.setdefault(Path(p).parent, {})[Path(p).name] = _profile_text(p, mapping).encode("utf-8")
    for folder, files in folders.items():
        write_files(folder, files)
    for p, fit, _ in done:
        print(f"{p} fitted: " + format_params(fit))
    print("profiles rewritten, compute pooled: " + ", ".join(args.pool))
    return 0


def cmd_calibrate(args) -> int:
    if args.pool:
        if args.runs:
            raise InputError("--pool", None, "applies to microbenchmark calibration, not to --runs")
        if args.folds is not None:
            raise InputError("--folds", None, "applies to --runs, not to --pool")
        return _pool(args)
    if not args.out:
        raise InputError("calibrate", "--out", "give the profile file to write (--out PROFILE.yaml)")
    args.model = args.model or DEFAULT_MODEL
    if args.runs and args.compute_from:
        raise InputError("--compute-from", None, "applies to microbenchmark calibration, not to --runs")
    if args.runs and args.memory_model != MEMORY_MODELS[0]:
        raise InputError("--memory-model", None, "applies to microbenchmark calibration, not to --runs")
    if args.runs and args.stage_scales:
        raise InputError("--stage-scales", None, "applies to microbenchmark calibration, not to --runs")
    if args.folds is not None and not args.runs:
        raise InputError("--folds", None, "applies to calibration from run logs (--runs), not to microbenchmarks")
    if args.runs:
        # Each run names its own cluster in the file; a TOPOLOGY or --world would go unused.
        for flag, given in (("TOPOLOGY", args.topology), ("--world", args.world)):
            if given is not None:
                raise InputError(flag, None, "applies to microbenchmark calibration, not to --runs "
                                             "(each run's cluster is in its row)")
        return _from_runs(args)
    if not args.topology:
        raise InputError("calibrate", "topology", "give a TOPOLOGY to calibrate from microbenchmarks, or --runs CSV")
    if args.quick and (args.repeats is not None or args.max_bytes is not None):
        # --quick is a fixed smoke-test sweep; silently dropping the user's figures would
        # report a calibration they did not ask for.
        raise InputError("--quick", None, "sets its own repeats (3) and largest size (1 MiB); drop --repeats and "
                         "--max-bytes, or drop --quick")
    args.repeats = 5 if args.repeats is None else args.repeats
    args.max_bytes = 64 * 1024 * 1024 if args.max_bytes is None else args.max_bytes
    # The collective sweep starts at 4 KiB (MIN_COLLECTIVE_BYTES); below it no link could be fitted.
    for flag, value, lo, hi in (("--repeats", args.repeats, 1, MAX_BENCH_REPEATS),
                                ("--max-bytes", args.max_bytes, MIN_COLLECTIVE_BYTES, MAX_COLLECTIVE_BYTES)):
        problem = number_problem(value, lo, hi, integer=True)
        if problem:
            raise InputError(flag, None, f"{str(value)[:60]}: {problem}")
    from reports.files import output_file
    # Both files are checked before the microbenchmarks: the profile and its record beside it,
    # writable and none of the inputs.
    from validate.bench_record import bench_record_path
    inputs = [("topology", args.topology), ("--model", args.model), ("--compute-from", args.compute_from)]
    output_file(bench_record_path(output_file(args.out, "--out", inputs)), "--out (its .bench.json record)", inputs)
    from specs.model import load_model
    from validate.backend import require_torch

    cluster, world = resolve_world(args.topology, args.world)
    model = load_model(args.model)
    from validate.backend import check_worker_env
    check_worker_env()  # the workers' settings in the environment, before anything is measured
    require_torch()
    from validate.calibrate import calibrate
    from validate.profile_file import format_params, format_residuals
    from validate.collective_bench import format_collectives
    from validate.bench_record import format_compute

    def say(msg):
        print(msg, file=sys.stderr, flush=True)

    kw = dict(repeats=3, max_bytes=1024 * 1024, max_gemm_dim=256) if args.quick else dict(
        repeats=args.repeats, max_bytes=args.max_bytes)
    cal = calibrate(cluster, model, world, progress=None if args.json else say, compute_from=args.compute_from,
                    memory_model=args.memory_model, stage_scales=args.stage_scales, **kw)
    # The measurements beside the profile (P.yaml -> P.bench.json): the validation report
    # draws the calibration curves against them. Both written together, atomically.
    out = Path(args.out)
    bench = {**cal.bench.to_dict(), "gpu": cluster.devices[0].gpu.name, "topology": args.topology}
    from reports.files import write_files
    write_files(out.parent, {out.name: _profile_text(args.out, cal.mapping).encode("utf-8"),
                             bench_record_path(out).name: json.dumps(bench, indent=1).encode("utf-8")})
    if args.json:
        print(json.dumps({"bench": cal.bench.to_dict(), "profile": cal.mapping,
                          "residual_rms_pct": {k: cal.fit.rms_pct(k) for k in cal.fit.residuals if cal.fit.residuals[k]}},
                         indent=2))
        return 0
    print(format_compute(cal.bench))
    if cal.bench.collectives:
        print(format_collectives(cal.bench.collectives))
    print(format_residuals(cal.fit))
    print("fitted: " + format_params(cal.fit))
    if cal.bench.checkpoint_region_us:
        print("measured: " + " ".join(f"checkpoint_{k}_region_us={v:.1f}"
                                      for k, v in sorted(cal.bench.checkpoint_region_us.items())))
    if cal.bench.fsdp_unit:
        print(f"measured: fsdp_unit_us={cal.bench.fsdp_unit['us']:.1f} "
              f"fsdp_unit_us_per_mib={cal.bench.fsdp_unit['us_per_mib']:.1f}")
    if cal.bench.alive:
        print(f"measured: alive_knee_mib={cal.bench.alive['knee_mib']:.2f} "
              f"alive_slowdown_per_doubling={cal.bench.alive['per_doubling']:.4f}")
    print(f"microbenchmarks took {cal.bench.wall_s:.1f} s; profile written to {args.out}")
    return 0
