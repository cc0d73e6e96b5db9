"""Several calibrations' compute samples pooled: `plansim calibrate --pool P1.yaml P2.yaml`.

Why (docs/validation-cpu.md, mechanism 58): a calibration's compute figures are a few
draws of a host whose speed moves by a fifth within minutes, and two calibrations of the
same compute taken minutes apart disagree. On a 2-core host `plansim calibrate --world 2`
and `--world 4` both time compute in two processes at once (microbench.compute_processes),
so their compute samples are draws of one thing; yet session 26's run d-3 fitted GEMMs at
0.098 of the catalog peak at world 2 and 0.137 at world 4, about two minutes later.
Fitting each profile to both calibrations' samples, pooled, halves what one slow or fast
moment weighs; each keeps its own collectives, which were measured at its own process
count. Refitting the 23 saved runs of sessions 24-26 so (benchmarks/repredict.py --refit
--pool) met the target on the six in 14 of them against 11 without; the 36 of sessions
19-22, 19 either way.

What is pooled, for each profile from its own record (P.bench.json) and the others':
- every compute sample the profile's record holds (GEMM, memory-bound op, fused
  attention, top-k selection, the harness's smallest calls): the mean of the records
  that timed it (a shape only one record timed keeps its own figure);
- every list of draws (the overhead chain, recompute, FSDP, alive, microbatch and split
  draws) and the speed probe's draws, concatenated; the figures fitted to draws are fitted
  again to the pooled ones (the overhead chain's and the probe's medians, the
  per-microbatch host cost, FSDP's unit cost, the alive law); the checkpoint regions,
  each record's figure, are averaged as the samples are.
Only records measured under the same conditions pool: backend, processes computing at
once, threads per process, host cores, and the same model's layers in the alive and split
draws (InputError naming the record and the field otherwise). The records stay as
measured; each profile's source names the records its compute was pooled from, and
``benchmarks/repredict.py --refit --pool`` refits saved runs the same way.
"""
from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

from costmodel.errors import InputError
from costmodel.limits import number_problem
from validate.bench_record import MicrobenchResult

# Conditions two records' compute must share to be draws of one thing, with how to read each.
CONDITIONS = (
    ("backend", lambda r: r.backend),
    ("compute_world", lambda r: r.compute_world or r.world),
    ("threads", lambda r: r.threads),
    ("host_cores", lambda r: r.host_cores),
    ("alive_held_mib", lambda r: [round(float(x), 6) for x in r.alive_held_mib]),
    ("microbatch_ops", lambda r: list(r.microbatch_ops)),
    ("split_model", lambda r: r.split_model or {}),
)
DRAW_LISTS = ("overhead_draws", "recompute_draws", "fsdp_draws", "alive_draws", "microbatch_draws", "split_draws")


def _probe_draws(res: MicrobenchResult, source: str) -> list[float]:
    """``res``'s probe draws (0: a launch that took none), checked: numbers of seconds in [0, 60)."""
    draws = res.probe_draws_s or ([res.probe_s] if res.probe_s > 0 else [])
    if not isinstance(draws, list):
        raise InputError(source, "probe_draws_s", "expected a list of seconds")
    for i, d in enumerate(draws):
        problem = number_problem(d, 0.0, 60.0, hi_open=True)
        if problem:
            raise InputError(source, f"probe_draws_s[{i}]", f"{str(d)[:40]}: {problem}")
    return [float(d) for d in draws if d > 0]


def _mean_over(own: list, others: list[list], key) -> list:
    """``own``'s samples, each with ``seconds`` (and a top-k sample's ``cv``) the mean over
    the records that hold a sample of the same ``key``."""
    out = []
    for s in own:
        same = [s] + [o for rows in others for o in rows if key(o) == key(s)]
        fields = {"seconds": statistics.fmean(x.seconds for x in same)}
        if hasattr(s, "cv"):
            fields["cv"] = statistics.fmean(x.cv for x in same)
        out.append(replace(s, **fields))
    return out


def pooled_compute(own: MicrobenchResult, own_source: str,
                   others: list[tuple[MicrobenchResult, str]]) -> MicrobenchResult:
    """``own`` with its compute samples pooled with ``others``' ([(record, its file)]; see
    the module docstring): its collectives, launches and world untouched. InputError
    naming the record and the field when one is malformed or measured under other
    conditions."""
    from validate.microbench import checked_compute, fit_draw_figures, overhead_from_draws, probe_from_draws
    records = [(own, own_source)] + list(others)
    checked = [checked_compute(r, src) for r, src in records]
    probes = [_probe_draws(r, src) for r, src in records]
    for r, src in others:
        for name, read in CONDITIONS:
            if read(r) != read(own):
                raise InputError(src, name, f"{str(read(r))[:60]}: its compute ran under other conditions than "
                                 f"{own_source}'s ({str(read(own))[:60]}); only records of the same host, processes "
                                 "at once, threads and model pool")
    rows = [r for r, _ in records[1:]]
    out = replace(own)
    out.gemm = _mean_over(own.gemm, [r.gemm for r in rows], lambda g: (g.m, g.n, g.k, g.batch))
    out.memory = _mean_over(own.memory, [r.memory for r in rows], lambda x: (x.op, x.elems))
    out.attention = _mean_over(own.attention, [r.attention for r in rows], lambda a: (a.batch, a.s, a.d))
    out.topk = _mean_over(own.topk, [r.topk for r in rows], lambda t: (t.elems, t.fraction))
    out.harness = {k: statistics.fmean([v] + [r.harness[k] for r in rows if k in r.harness])
                   for k, v in own.harness.items()}
    for name in DRAW_LISTS:
        setattr(out, name, [list(d) for c in checked for d in c[name]])
    out.probe_draws_s = [d for ds in probes for d in ds]  # each positive (_probe_draws)
    probe_from_draws(out)
    overhead_from_draws(out)
    out = fit_draw_figures(out)  # the per-microbatch host cost, FSDP's unit, the alive law
    # The checkpoint regions as each record's calibration priced them (against its compute
    # worker's per-op figure, microbench._measure_compute), averaged like the samples.
    regions = [c["checkpoint_region_us"] for c in checked]
    out.checkpoint_region_us = {k: statistics.fmean(r[k] for r in regions if k in r)
                                for k in regions[0]}
    return out


# What pooling adds to a profile's source (taken off again before a profile is pooled anew).
POOLED_NOTE = "; compute samples pooled with "


def pool_profiles(paths: list[str], memory_model: str = "bandwidth", stage_scales: bool = False) -> list[tuple]:
    """[(profile path, FitResult, profile mapping)] for each of ``paths`` (profiles written by
    `plansim calibrate` from microbenchmarks, each with its record beside it), refitted to
    its own record with the compute samples of every record pooled (pooled_compute).
    Nothing is written here. InputError (one line, naming the file and the field) for a
    missing or malformed profile or record, the same file twice, or records that do not pool."""
    from costmodel.yamlio import load_yaml_mapping
    from plansim.cmd_calibrate import resolve_world
    from validate.bench_record import bench_record_path, load_bench_dict
    from validate.calibrate import profile_from_bench
    from validate.profile_file import SOURCE_PREFIX
    if len(paths) < 2:
        raise InputError("--pool", None, "give two or more profiles whose compute to pool")
    resolved = [Path(p).resolve() for p in paths]
    for i, p in enumerate(resolved):
        if p in resolved[:i]:
            raise InputError(paths[i], "--pool", "given twice; give each profile once")
    loaded = []
    for p in paths:
        mapping = load_yaml_mapping(p, what="profile")
        src = mapping.get("source")
        if not isinstance(src, str) or not src.startswith(SOURCE_PREFIX):
            raise InputError(p, "source", "not a profile `plansim calibrate` fitted to microbenchmarks "
                             f"(its source should start {SOURCE_PREFIX.strip()!r})")
        record = bench_record_path(Path(p))
        data = load_bench_dict(record, "--pool")
        topology = data.get("topology")
        if not topology:
            raise InputError(str(record), "topology", "absent: this record does not say which topology it calibrated")
        where = src[len(SOURCE_PREFIX):].split(POOLED_NOTE)[0]  # the records stay as measured: pool anew
        loaded.append((p, where, str(record), MicrobenchResult.from_dict(data), topology))
    out = []
    for i, (p, where, record, res, topology) in enumerate(loaded):
        others = [(r, rec) for j, (_, _, rec, r, _) in enumerate(loaded) if j != i]
        pooled = pooled_compute(res, record, others)
        cluster, _ = resolve_world(topology, res.world, "world", f"{record}: ")
        names = ", ".join(Path(rec).name for _, rec in others)
        fit, mapping = profile_from_bench(cluster, pooled, f"{where}{POOLED_NOTE}{names} "
                                          "(validate/pool.py: same conditions)", memory_model, stage_scales)
        out.append((p, fit, mapping))
    return out
