"""Human-readable text for one simulated step (what `plansim simulate` prints)."""
from __future__ import annotations

from tabulate import tabulate

from sim.result import StepResult


def summary_text(res: StepResult) -> str:
    lines = [
        f"plansim: {res.model} on {res.topology} ({res.num_devices} devices)",
        f"plan:    {res.plan}",
        "",
        f"step time           {res.step_time_s:10.3f} s",
        f"throughput          {res.tokens_per_s:10.0f} tokens/s",
        f"model TFLOP/s/GPU   {res.model_tflops_per_gpu:10.1f}   (MFU {100 * res.mfu:.1f} %)",
        f"hw TFLOP/s/GPU      {res.hardware_tflops_per_gpu:10.1f}   (HFU {100 * res.hfu:.1f} %)",
        f"pipeline bubble     {100 * res.bubble_fraction:10.1f} % of the step",
        f"peak memory         {res.peak_memory_gib:10.1f} GiB   "
        + ("fits" if res.fits_memory else f"DOES NOT FIT: short by {res.memory_shortfall_gib:.1f} GiB"),
        f"bottleneck          {res.bottleneck:>10}",
        "",
        "time breakdown (mean over devices)",
    ]
    rows = [[k, f"{v:.3f}", f"{100 * v / res.step_time_s:.1f}"] for k, v in res.breakdown.items()]
    lines.append(tabulate(rows, headers=["part", "seconds", "%"], tablefmt="simple"))
    lines += ["", "simulated devices (each stands for 'x' devices)"]
    rows = []
    for d in res.devices:
        mem = f"{d.peak_memory_gib:.1f}/{d.capacity_gib:.0f}"
        rows.append([d.rank, d.stage, d.gpu, d.represents, f"{d.busy_s:.3f}",
                     f"{d.breakdown_s['bubble']:.3f}", f"{d.breakdown_s['dp']:.3f}", mem,
                     "yes" if d.fits_memory else "NO"])
    lines.append(tabulate(rows, headers=["rank", "stage", "gpu", "x", "busy s", "bubble s", "dp s",
                                         "mem GiB", "fits"], tablefmt="simple"))
    if res.busiest_links:
        lines += ["", "busiest links"]
        rows = [[r["link"], r["kind"], f"{100 * r['utilisation']:.1f} %"] for r in res.busiest_links[:5]]
        lines.append(tabulate(rows, headers=["link", "kind", "busy"], tablefmt="simple"))
    lines.append(f"\n(simulated in {res.sim_wall_s:.2f} s)")
    return "\n".join(lines)

