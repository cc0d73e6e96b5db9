"""The profile file plansim calibrate writes: the fitted parameters (validate/calibrate.py)
in the bundled profiles' schema (costmodel/profiles/*.yaml), with ``source`` fields that
say what was measured, where and when, and the residual and parameter listings it prints.
"""
from __future__ import annotations

import platform
import socket
from datetime import datetime, timezone

from validate.calibrate import CPU_ATTENTION_SHAPE, FITTED_COLLECTIVES, FitResult
from validate.bench_record import MicrobenchResult
from validate.probe import CALL_PROBE_BYTES, call_probe_figure


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else platform's description."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# How a profile fitted to microbenchmarks opens its source (validate/pool.py reads the rest back).
SOURCE_PREFIX = "plansim calibrate (microbenchmarks only), "


def where_and_when(res: MicrobenchResult, device_name: str) -> str:
    import torch
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (f"{now} on {socket.gethostname()} ({device_name}; CPU {cpu_model()}), torch {torch.__version__}, "
            f"backend {res.backend}, {res.world} concurrent worker process(es), {res.threads} thread(s) each")


# Facts about how validate/'s torch runner (validate/gpt.py) drives a device (not fits):
# eager PyTorch, one op at a time; on a CPU the op runs in the issuing thread
# (launch_blocking); fused attention (torch's scaled_dot_product_attention: no s x s scores
# in memory); no dropout, so the cost model's dropout + residual pair is the one residual
# add (fused_bias_dropout_add); autograd accumulates gradients in a separate pass; pipeline
# activations sent whole by every TP rank; no asynchronous TP all-reduce in backward, and
# with SP no re-gather of a GEMM's input in backward (autograd saved the gathered one);
# gradients reduced in fp32; Adam as eager element-wise ops (validate/dp.adam_update).
def runtime_facts(kind: str) -> dict:
    return {
        "launch_blocking": kind == "cpu",
        "p2p_scatter_gather": False,
        "p2p_blocking": False,
        # validate/pp.py posts every pipeline receive at the start of the step, so a send
        # never waits for its receive, whatever the transport (gloo's pairs are a
        # rendezvous: costmodel/profile.RuntimeSettings.p2p_rendezvous).
        "p2p_rendezvous": False,
        "tp_bwd_overlap": False,
        # autograd saves the sequence-gathered input of each column-parallel GEMM (validate/tp.py)
        "sp_regather_input": False,
        "dropout": False,  # validate/gpt.py has none: no masks kept for backward
        "fused_bias_dropout_add": True,
        "grad_accumulation_fusion": False,
        "flash_attention": True,
        # context parallelism: validate/cp.py's ring, unfused pieces merged by log-sum-exp
        "cp_attention_pieces": True,
        "grad_reduce_dtype": "fp32",
        "zero1_grad_all_reduce": False,
        "eager_adam": True,
    }


def profile_mapping(fit: FitResult, res: MicrobenchResult, gpu_name: str, link_kind: str | None,
                    device_kind: str, where: str, name: str) -> dict:
    """The profile as a mapping in the bundled profiles' schema (load_profile reads it)."""
    call_s = call_probe_figure(res)
    call_note = (f"call_probe_us: what a {CALL_PROBE_BYTES // 1024} KiB 2-rank all-reduce added to a round of "
                 "about 1 ms of layer code, the median of its after-compute launches (validate/probe.call_probe_s "
                 "times the same during a validation). " if call_s else "")
    g = fit.gpu
    gpu_src = (f"FIT by plansim calibrate, {where}. Measured: {len(res.gemm)} GEMM shapes "
               f"(best {fit.measured_peak_flops / 1e9:.1f} GFLOP/s per process; residual RMS "
               f"{fit.rms_pct('gemm'):.1f} %), {len(res.memory)} memory-bound op sizes (best "
               f"{fit.measured_peak_Bps / 1e9:.1f} GB/s; RMS {fit.rms_pct('memory'):.1f} %), tiny-op chains "
               f"(plain {g.kernel_overhead_us:.2f} us/op), {len(res.topk)} top-k selections (validate/topk.select; "
               f"RMS {fit.rms_pct('topk'):.1f} %). Efficiencies are fractions of the catalog peaks "
               f"(costmodel/gpus.py {gpu_name}).")
    out = {
        "name": name,
        "source": f"{SOURCE_PREFIX}{where}",
        "gpus": {gpu_name: {
            "gemm_eff_max": round(g.gemm_eff_max, 5), "gemm_k_half": round(g.gemm_k_half, 3),
            "gemm_dim_half": round(g.gemm_dim_half, 3), "sm_count": 0,
            "attention_eff": round(g.attention_eff, 5),
            **CPU_ATTENTION_SHAPE, "hbm_eff": round(g.hbm_eff, 5), "vector_flops_eff": round(g.vector_flops_eff, 5),
            "cache_bw_eff": round(g.cache_bw_eff, 5), "cache_mib": round(g.cache_mib, 4), "kernel_overhead_us": round(g.kernel_overhead_us, 3),
            "topk_select_ns_per_elem": round(g.topk_select_ns_per_elem, 4),
            "topk_select_ns_per_kept": round(g.topk_select_ns_per_kept, 4),
            "topk_select_cv": round(g.topk_select_cv, 4),
            "source": gpu_src,
        }},
        "runtime": {"host_overhead_us": round(fit.host_overhead_us, 3), **runtime_facts(device_kind),
                    # CPU workers share the host's cores (sim/core_sharing.py); GPUs do not.
                    "host_cores": res.host_cores if device_kind == "cpu" else 0,
                    "comm_busy_fraction": round(res.comm_busy_fraction, 4) if device_kind == "cpu" else 0.0,
                    "speed_probe_us": round(res.probe_s * 1e6, 2),
                    **({"call_probe_us": round(call_s * 1e6, 1)} if call_s else {}),
                    "straggler_us": round(res.straggler_s * 1e6, 1),
                    **{f"checkpoint_{k}_region_us": round(v, 1) for k, v in sorted(res.checkpoint_region_us.items())},
                    **({"fsdp_unit_us": round(res.fsdp_unit["us"], 1),
                        "fsdp_unit_us_per_mib": round(res.fsdp_unit["us_per_mib"], 1)} if res.fsdp_unit else {}),
                    **({"microbatch_host_us": round(res.microbatch_host["us"], 1)} if res.microbatch_host else {}),
                    **({"alive_knee_mib": round(res.alive["knee_mib"], 3),
                        "alive_slowdown_per_doubling": round(res.alive["per_doubling"], 4)} if res.alive else {}),
                    "source": (f"host_overhead_us FIT by plansim calibrate ({where}): per cost-model op, "
                               f"forward+backward of tiny-op chains under autograd minus the plain per-op cost. "
                               f"host_cores: the cores the worker processes share (affinity mask), compute "
                               f"measured in {res.compute_world or res.world} process(es) at once. "
                               f"speed_probe_us: validate/probe.py's probe then, the median of {max(1, len(res.probe_draws_s))} "
                               f"draw(s) (the compute processes' and one per collective launch). "
                               f"{call_note}"
                               f"comm_busy_fraction: CPU seconds per wall second in a stream of small all-reduces "
                               f"(validate/contention_bench.busy_fraction_row). "
                               f"straggler_us: the extra wait of a 32 KiB all-reduce closing about 50 ms of "
                               f"GEMMs over one closing 1 ms (validate/contention_bench.straggler_row). "
                               f"checkpoint_*_region_us: what one checkpointed region adds to the runner's layer "
                               f"chain at width 8 beyond its recomputed ops (validate/host_draws.recompute_drawer). "
                               f"fsdp_unit_us, fsdp_unit_us_per_mib: what taking one ZeRO-3 unit into use adds, "
                               f"from the runner's FSDP at one process at widths 8 and 64 (validate/host_draws.fsdp_drawer). "
                               f"microbatch_host_us: what each microbatch of a chunk costs besides its ops, from the "
                               f"runner's overhead chain trained at two shapes, a x ops + F x microbatches "
                               f"(validate/host_draws.microbatch_drawer); host_overhead_us is then per op without it. "
                               f"alive_knee_mib, alive_slowdown_per_doubling: three layers of the model trained in orders "
                               f"1-12 microbatches deep, each step timed after one of the same order, step time against "
                               f"the activations held (validate/alive_bench.alive_drawer). "
                               f"Other fields: how validate/'s eager torch runner drives the device.")},
    }
    if fit.fabric is not None and link_kind:
        f = fit.fabric
        out["fabrics"] = {link_kind: {
            "bw_eff": round(f.bw_eff, 5), "call_latency_us": round(f.call_latency_us, 3),
            "hop_latency_us": None if f.hop_latency_us is None else round(f.hop_latency_us, 3),
            **{f"{op}_call_us": round(getattr(f, f"{op}_call_us"), 3) for op in FITTED_COLLECTIVES
               if getattr(f, f"{op}_call_us") is not None},
            "call_us_per_rank": round(f.call_us_per_rank, 3),
            **({"send_recv_posted_busy_us": round(res.posted_busy_s * 1e6, 1),
                "send_recv_posted_idle_us": round(res.posted_idle_s * 1e6, 1)}
               # a busy-sender figure says both streams ran; the idle one may be a true 0 (the
               # message was there and cost the round nothing more), which is kept as such
               if res.posted_busy_s > 0 else {}),
            **({"send_recv_preposted_us": round(res.preposted_s * 1e6, 1)} if res.preposted_s > 0 else {}),
            **({"send_recv_preposted_call_us": round(res.preposted_call_s * 1e6, 1)}
               if res.preposted_s > 0 and res.preposted_call_s > 0 else {}),
            "source": (f"FIT by plansim calibrate, {where}: {', '.join(FITTED_COLLECTIVES)} over "
                       f"{res.world} processes, {len(fit.residuals.get('collectives', []))} sizes x ops "
                       f"(RMS {fit.rms_pct('collectives'):.1f} %), against the topology's link bandwidth; "
                       f"hop_latency_us per ring step (replaces the topology's latency); <op>_call_us per call of "
                       f"each collective, fitted to its calls in a stream of compute rounds as a plan issues "
                       f"them (RMS {fit.rms_pct('collectives after compute'):.1f} %); call_latency_us, for "
                       f"other collectives, their median."
                       + (" send_recv_posted_busy_us and _idle_us MEASURED: what receiving a 32 KiB message "
                          "its sender posted earlier adds to a round of the runner's layer code, the sender "
                          "computing or blocked (validate/handoff_bench.posted_rows)."
                          if res.posted_busy_s > 0 else "")
                       + (" send_recv_preposted_us MEASURED: what one pipeline handoff into a receive posted "
                          "before its send adds to a ping-pong of the runner's layer code in pairs of ranks "
                          "(validate/handoff_bench.preposted_handoff_s); the pipeline's sends use it."
                          if res.preposted_s > 0 else "")
                       + (" send_recv_preposted_call_us MEASURED: the sender's isend call within that "
                          "handoff, which the sender's compute stream pays."
                          if res.preposted_s > 0 and res.preposted_call_s > 0 else "")),
        }}
    return out


def format_residuals(fit: FitResult) -> str:
    lines = []
    for fam, rows in fit.residuals.items():
        lines.append(f"# {fam}: residual RMS {fit.rms_pct(fam):.1f} %")
        lines.append(f"{'sample':>28} {'measured (us)':>14} {'fit (us)':>10} {'error':>8}")
        for label, m, p in rows:
            lines.append(f"{label:>28} {m * 1e6:>14.1f} {p * 1e6:>10.1f} {100 * (p / m - 1):>+7.1f}%")
    return "\n".join(lines)


def format_params(fit: FitResult) -> str:
    g, f = fit.gpu, fit.fabric
    s = (f"gemm_eff_max={g.gemm_eff_max:.4f} gemm_k_half={g.gemm_k_half:.1f} gemm_dim_half={g.gemm_dim_half:.1f} "
         f"attention_eff={g.attention_eff:.4f} hbm_eff={g.hbm_eff:.4f} vector_flops_eff={g.vector_flops_eff:.4f} cache_bw_eff={g.cache_bw_eff:.4f} cache_mib={g.cache_mib:.2f} kernel_overhead_us={g.kernel_overhead_us:.2f} host_overhead_us={fit.host_overhead_us:.2f} "
         f"topk_select_ns_per_elem={g.topk_select_ns_per_elem:.2f} topk_select_ns_per_kept={g.topk_select_ns_per_kept:.2f} "
         f"topk_select_cv={g.topk_select_cv:.3f}")
    if f is not None:
        s += f" bw_eff={f.bw_eff:.4f} call_latency_us={f.call_latency_us:.1f}"
        s += "".join(f" {op}_call_us={getattr(f, f'{op}_call_us'):.1f}" for op in FITTED_COLLECTIVES
                     if getattr(f, f"{op}_call_us") is not None)
        if f.hop_latency_us is not None:
            s += f" hop_latency_us={f.hop_latency_us:.1f}"
        s += f" call_us_per_rank={f.call_us_per_rank:.1f}"
    return s
