"""`plansim` command line: parse, call, print. Bad input -> one line on stderr, exit 2."""
from __future__ import annotations

import argparse
import importlib
import json
import sys

from costmodel.errors import MAX_MESSAGE, InputError, RunError, clip

DEFAULT_TOPOLOGY = "dgx-a100"
# Subcommands that live in modules of their own; each module has register(subparsers),
# which adds its parser and sets `func`. Helpers here (_add_common, _load_inputs) are shared.
COMMAND_MODULES: list[str] = ["plansim.cmd_report", "plansim.cmd_search", "plansim.cmd_accuracy", "plansim.cmd_calibrate",
                               "plansim.cmd_validate", "plansim.cmd_adaptive", "plansim.cmd_sweep"]


def _add_common(p: argparse.ArgumentParser, topology_default: str | None = DEFAULT_TOPOLOGY) -> None:
    p.add_argument("topology", nargs="?" if topology_default else None, default=topology_default,
                   help=f"bundled topology name or YAML path (default {topology_default})")
    p.add_argument("--nodes", type=int, help="scale a single-group topology to N nodes")
    p.add_argument("--model", default=None, help="model preset or YAML file (default gpt3-1.3b)")
    p.add_argument("--profile", help="hardware profile YAML merged over the bundled default")
    p.add_argument("--seq", type=int, help="override the model's seq_length (e.g. 131072 for a long-context phase)")
    p.add_argument("--global-batch", type=int, help="override the model's global_batch_size (sequences per step)")
    add_runtime_arg(p, default="megatron-core")


def add_runtime_arg(p: argparse.ArgumentParser, default: str | None) -> None:
    """--runtime NAME: the bundled framework runtime (costmodel/profile.RUNTIMES, docs/runtimes.md)."""
    from costmodel.profile import RUNTIMES
    tail = f" (default {default})" if default else " (default: the profile's own runtime section)"
    p.add_argument("--runtime", default=default, metavar="NAME",
                   help=f"framework runtime: {', '.join(RUNTIMES)}{tail}")


def _check_nodes(args) -> None:
    from costmodel.limits import MAX_NODES

    if args.nodes is not None and not 1 <= args.nodes <= MAX_NODES:
        raise InputError("--nodes", None, f"{str(args.nodes)[:60]}: must be an integer in [1, {MAX_NODES}]")


def _model(args):
    """The --model preset or file with --seq / --global-batch applied."""
    from specs.model import DEFAULT_MODEL, load_model, with_overrides

    return with_overrides(load_model(args.model or DEFAULT_MODEL), getattr(args, "seq", None),
                          getattr(args, "global_batch", None))


def _load_inputs(args):
    from costmodel.profile import for_gpus, load_profile, runtime_profiles
    from specs.topology import load_topology

    _check_nodes(args)
    runtime = getattr(args, "runtime", None)
    runtime_profiles(runtime)  # a bad name fails before the cluster is built
    cluster = load_topology(args.topology, nodes=args.nodes)
    model = _model(args)
    # The topology names the bundled profiles of its fabric, --runtime the framework's
    # overlays; --profile goes over them.
    profile = load_profile(args.profile, bundled=cluster.profiles, runtime=runtime)
    profile = for_gpus(profile, {d.gpu.name for d in cluster.devices})
    _note_uncalibrated(profile, {d.gpu.name for d in cluster.devices})
    return cluster, model, profile


def _note_uncalibrated(profile, gpu_names) -> None:
    """One line on stderr when a GPU's compute times rest on the generic efficiencies
    (costmodel/profile.uncalibrated_gpus): a prediction that looks as precise as the others
    but is not, e.g. MI300X at 75 % of its datasheet peak."""
    from costmodel.profile import uncalibrated_gpus
    bad = uncalibrated_gpus(profile, gpu_names)
    if bad:
        g = profile.gpus.get("default")
        _NOTES.append(f"plansim: note: no calibrated efficiency for {', '.join(bad)} in the profile: "
                      f"generic GEMMs at {100 * g.gemm_eff_max:.0f} % of datasheet peak, attention at "
                      f"{100 * g.attention_eff:.0f} %; times of these GPUs are unchecked (plansim calibrate, "
                      "or --profile with a gpus entry)")


# Notes for stderr, printed once the command has succeeded: a run that fails on bad input
# prints its one error line and nothing else.
_NOTES: list[str] = []


def cmd_simulate(args) -> int:
    from plansim import cmd_multistep
    from plansim.summary import summary_text
    from reports.files import check_outputs, staged
    from reports.trace import write_trace
    from sim.metrics import simulate
    from specs.plan import resolve_plan
    from specs.topology import topology_devices

    # Every output path is checked before any work, so a bad one leaves nothing written:
    # writable, none an input of the command, not the same as or inside the other.
    from reports.report import FILES, TRACE
    names = cmd_multistep.REPORT_FILES if cmd_multistep.wanted(args) else (*FILES, TRACE)
    check_outputs([("--trace", args.trace, None), ("--report", args.report, names)],
                  [("topology", args.topology), ("--model", args.model), ("--plan", args.plan),
                   ("--profile", args.profile), ("--scenario", args.scenario)])
    cmd_multistep.check_values(args)
    # A bad plan fails before the cluster is built (which takes seconds at 100k devices).
    _check_nodes(args)
    resolve_plan(args.plan or "", _model(args), topology_devices(args.topology, args.nodes))
    cluster, model, profile = _load_inputs(args)
    plan = resolve_plan(args.plan or "", model, cluster.num_devices)
    if cmd_multistep.wanted(args):  # --steps / --scenario / --adaptive: many steps in one run
        return cmd_multistep.run(args, model, plan, cluster, profile)
    res = simulate(model, plan, cluster, profile, record=args.trace is not None or args.report is not None)
    with staged():  # both outputs or neither
        if args.trace:
            write_trace(res, args.trace)
        if args.report:
            from reports.report import write_simulation_report
            write_simulation_report(args.report, res)
    if args.json:
        print(json.dumps(res.to_dict(), indent=2))
    else:
        print(summary_text(res))
        if args.runtime:
            print(f"runtime: {args.runtime} (docs/runtimes.md; --runtime to change)")
        if args.trace:
            print(f"trace written to {args.trace} (open it in https://ui.perfetto.dev)")
        if args.report:
            print(f"report written to {args.report}/index.html")
    return 0


def cmd_models(args) -> int:
    from tabulate import tabulate

    from specs.model import PRESETS
    rows = [[k, m.num_layers, m.hidden_size, m.num_attention_heads, m.kv_groups, m.ffn, m.seq_length,
             m.vocab_size, m.global_batch_size, m.activation, f"{m.total_params / 1e9:.2f}"]
            for k, m in PRESETS.items()]
    print(tabulate(rows, headers=["preset", "layers", "hidden", "heads", "kv", "ffn", "seq", "vocab",
                                  "batch", "act", "params (B)"]))
    return 0


def cmd_topologies(args) -> int:
    from specs.topology import list_topologies, load_topology
    for name in list_topologies():
        c = load_topology(name)
        gpus = sorted({d.gpu.name for d in c.devices})
        print(f"{name:20s} {c.num_devices:6d} devices  {len(c.nodes):4d} nodes  {', '.join(gpus)}")
    return 0


class _OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr and exit 2 like every other bad
    input (argparse prints the whole usage block first); --help still prints it all.
    Subcommand parsers are made of the same class (add_subparsers' default)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    ap = _OneLineParser(prog="plansim", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sp = sub.add_parser("simulate", help="simulate one training step of a plan")
    _add_common(sp)
    sp.add_argument("--plan", default="", help="k=v,... or a plan YAML (default: pure data parallel)")
    sp.add_argument("--json", action="store_true", help="print one JSON object")
    sp.add_argument("--trace", metavar="FILE", help="write a Chrome/Perfetto trace")
    sp.add_argument("--report", metavar="DIR", help="write index.html, report.md, plans.csv, trace.json")
    from plansim import cmd_multistep
    cmd_multistep.add_arguments(sp)
    sp.set_defaults(func=cmd_simulate)
    sub.add_parser("models", help="list model presets").set_defaults(func=cmd_models)
    sub.add_parser("topologies", help="list bundled topologies").set_defaults(func=cmd_topologies)
    for mod in COMMAND_MODULES:
        importlib.import_module(mod).register(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _NOTES.clear()
    try:
        code = args.func(args)
        for note in dict.fromkeys(_NOTES):  # once each, in order
            print(note, file=sys.stderr)
        return code
    except InputError as err:
        print(f"plansim: error: {err}", file=sys.stderr)
        return 2
    except RunError as err:  # a worker of a real run raised, hung or died: one line naming the rank
        print(f"plansim: error: {clip(str(err), MAX_MESSAGE)}".replace("\n", " "), file=sys.stderr)
        return 1
    except OSError as err:  # unreadable input, unwritable output: still one line, exit 2
        why = err.strerror or str(err)
        print(f"plansim: error: {InputError(err.filename, None, why) if err.filename else clip(why)}",
              file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
