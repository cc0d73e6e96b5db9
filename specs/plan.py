"""Parallel plans: parsing (`--plan k=v,...` or YAML), validation against model and cluster,
and the placement of (dp, stage, tp) coordinates onto device ranks.

Placement (documented contract): by default TP is innermost, then CP (context
parallelism), then PP, then DP:
``rank = tp_index + tp * (cp_index + cp * (stage + pp * dp_index))`` with ranks in the
topology's device order (groups in file order, nodes in order, local index). So a TP group
sits inside a node whenever tp divides the GPUs per node, and a CP group is next to it
(Megatron-Core's default rank order "tp-cp-ep-dp-pp" also puts cp right after tp:
megatron/core/parallel_state.py, initialize_model_parallel's `order`).
``placement=tp-dp-pp`` puts DP before PP:
``rank = tp_index + tp * (cp_index + cp * (dp_index + dp * stage))``, which keeps the
replicas of a stage next to each other (whole pipeline stages per device group on
heterogeneous clusters).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from costmodel.errors import InputError
from costmodel.limits import MAX_DEVICES, MAX_GLOBAL_BATCH, MAX_LAYERS, TOPK_FRACTION_MIN, number_problem
from costmodel.shapes import ModelSpec
from costmodel.yamlio import load_yaml_mapping, not_a_file
from specs.validation import Bool, Int, Strict, short, validate

Degree = Int(1, MAX_DEVICES)


class PlanFile(Strict):
    """What a user may write in a plan; omitted keys take the defaults. Sizes are bounded
    (costmodel/limits.py) before anything is allocated for them."""

    tp: Degree = 1
    # context parallelism: the sequence split over cp ranks (docs/context-parallelism.md)
    cp: Degree = 1
    cp_comm: Literal["ring", "a2a"] = "ring"
    pp: Degree = 1
    dp: Degree | None = None
    mbs: Int(1, MAX_GLOBAL_BATCH) = 1
    vpp: Int(1, MAX_LAYERS) = 1
    schedule: Literal["gpipe", "1f1b", "interleaved"] | None = None
    sp: Bool = False
    recompute: Literal["none", "selective", "full"] = "none"
    zero: Int(0, 3) = 0
    overlap_grad_reduce: Bool = True
    compress: str = "none"
    allreduce: Literal["ring", "tree", "hierarchical", "auto"] = "ring"
    precision: Literal["bf16", "fp16", "fp8", "fp32"] = "bf16"
    placement: Literal["tp-pp-dp", "tp-dp-pp"] = "tp-pp-dp"
    # layers per pipeline stage (non-uniform split); microbatches per data-parallel replica
    layers: list[Int(1, MAX_LAYERS)] | None = Field(default=None, max_length=MAX_DEVICES)
    mb_shares: list[Int(1, MAX_GLOBAL_BATCH)] | None = Field(default=None, max_length=MAX_DEVICES)
    # cross-step overlap (sim/multistep_executor.py, docs/scenarios.md): none, the optimizer
    # update and parameter gather overlapped with the next forward layer by layer, or
    # one-step-delayed gradient application (weights one step stale)
    overlap_step: Literal["none", "layerwise", "delayed"] = "none"

    @field_validator("layers", "mb_shares", mode="before")
    @classmethod
    def _colon_list(cls, v):
        # A plan file may write these as the --plan string does, `layers: "10:14"` (and,
        # since the YAML reader has no base-60 numbers, unquoted `layers: 10:14`).
        return v.split(":") if isinstance(v, str) else v

    @field_validator("compress")
    @classmethod
    def _compress(cls, v: str) -> str:
        parse_compress(v)
        return v


def parse_compress(v: str) -> float | None:
    """'none' -> None; 'topk:0.01' -> 0.01 (fraction of gradient entries kept)."""
    if v == "none":
        return None
    if v.startswith("topk:"):
        try:
            frac = float(v[5:])
        except ValueError:
            frac = -1.0
        if TOPK_FRACTION_MIN <= frac < 1.0:  # False for nan
            return frac
    raise ValueError(f"{short(v)}: must be 'none' or 'topk:FRACTION' with {TOPK_FRACTION_MIN:g} <= FRACTION < 1")


@dataclass(frozen=True)
class Plan:
    """A plan validated against one model and one cluster, with every default resolved."""

    tp: int
    pp: int
    dp: int
    mbs: int
    vpp: int
    schedule: str
    sp: bool
    recompute: str
    zero: int
    overlap_grad_reduce: bool
    compress: str
    allreduce: str
    precision: str
    placement: str
    layers: tuple[int, ...]  # per pipeline stage (pp entries); with vpp > 1 split evenly per chunk
    mb_shares: tuple[int, ...]  # microbatches per DP replica (dp entries)
    cp: int = 1  # context-parallel degree: each rank holds seq/cp tokens of every sequence
    cp_comm: str = "ring"  # ring (K/V blocks passed between neighbours) or a2a (Ulysses)
    # Whether the plan string states layers= / mb_shares=. True when the user (or the
    # heterogeneous balancer) gave the split, and forced True whenever the default split
    # that resolve_plan would compute is not this one: to_string must then print it, or
    # the string would not reproduce the plan (issue 8: a uniform 16:16 split with vpp=3
    # was printed without layers=, and resolving it raised InputError).
    explicit_layers: bool = False
    explicit_shares: bool = False
    overlap_step: str = "none"  # 'none' | 'layerwise' | 'delayed' (cross-step overlap)

    def __post_init__(self) -> None:
        layers_default = (len(set(self.layers)) <= 1
                          and sum(self.layers) % (self.pp * self.vpp) == 0)
        shares_default = len(set(self.mb_shares)) <= 1
        object.__setattr__(self, "explicit_layers", self.explicit_layers or not layers_default)
        object.__setattr__(self, "explicit_shares", self.explicit_shares or not shares_default)

    @property
    def topk_fraction(self) -> float | None:
        return parse_compress(self.compress)

    @property
    def num_devices(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    def rank(self, dp_index: int, stage: int, tp_index: int, cp_index: int = 0) -> int:
        inner = tp_index + self.tp * cp_index
        if self.placement == "tp-pp-dp":
            return inner + self.tp * self.cp * (stage + self.pp * dp_index)
        return inner + self.tp * self.cp * (dp_index + self.dp * stage)

    def rank_strides(self) -> tuple[int, int, int, int]:
        """How much rank() grows per unit of (dp_index, stage, tp_index, cp_index): rank()
        is affine in each argument under either placement, so a group of thousands of
        ranks is rank(0, 0, 0, 0) plus these strides (no call per rank)."""
        r0 = self.rank(0, 0, 0, 0)
        return (self.rank(1, 0, 0, 0) - r0, self.rank(0, 1, 0, 0) - r0,
                self.rank(0, 0, 1, 0) - r0, self.rank(0, 0, 0, 1) - r0)

    def tp_group(self, dp_index: int, stage: int, cp_index: int = 0) -> list[int]:
        return [self.rank(dp_index, stage, t, cp_index) for t in range(self.tp)]

    def dp_group(self, stage: int, tp_index: int, cp_index: int = 0) -> list[int]:
        return [self.rank(d, stage, tp_index, cp_index) for d in range(self.dp)]

    @property
    def grad_degree(self) -> int:
        """Ranks that hold the same weights and reduce their gradients together: dp*cp
        (the cp ranks of a replica see different tokens of the same sequences; Megatron-Core
        reduces gradients and shards its distributed optimizer over the data-parallel group
        "with context parallel": megatron/core/distributed/param_and_grad_buffer.py)."""
        return self.dp * self.cp

    def grad_group(self, stage: int, tp_index: int) -> list[int]:
        """The gradient-reduction (and ZeRO-sharding) group of ``stage``'s TP index
        ``tp_index``: every (dp, cp) pair; cp ranks of one replica are adjacent in the ring.
        With cp=1 this is dp_group."""
        base = self.rank(0, stage, tp_index, 0)
        sd, _, _, sc = self.rank_strides()
        return [base + sd * d + sc * c for d in range(self.dp) for c in range(self.cp)]

    def cp_group(self, dp_index: int, stage: int, tp_index: int) -> list[int]:
        """The ranks that split one sequence; ring neighbours are consecutive entries."""
        return [self.rank(dp_index, stage, tp_index, c) for c in range(self.cp)]

    def chunk_layers(self, stage: int) -> list[int]:
        """Layers of each of the vpp chunks on pipeline rank `stage`."""
        n = self.layers[stage]
        base, extra = divmod(n, self.vpp)
        return [base + (1 if c < extra else 0) for c in range(self.vpp)]

    def to_string(self, split: bool = True) -> str:
        """The plan in --plan syntax; `plansim simulate --plan` reproduces it. split=False
        leaves out explicit layers= and mb_shares= (the plan's even-split twin)."""
        parts = [
            f"tp={self.tp}", f"pp={self.pp}", f"dp={self.dp}", f"mbs={self.mbs}",
        ]
        if self.cp != 1:
            parts.insert(1, f"cp={self.cp}")
            if self.cp_comm != "ring":
                parts.insert(2, f"cp_comm={self.cp_comm}")
        if self.vpp != 1:
            parts.append(f"vpp={self.vpp}")
        parts.append(f"schedule={self.schedule}")
        if self.sp:
            parts.append("sp=true")
        if self.recompute != "none":
            parts.append(f"recompute={self.recompute}")
        if self.zero:
            parts.append(f"zero={self.zero}")
        if not self.overlap_grad_reduce:
            parts.append("overlap_grad_reduce=false")
        if self.compress != "none":
            parts.append(f"compress={self.compress}")
        if self.allreduce != "ring":
            parts.append(f"allreduce={self.allreduce}")
        if self.precision != "bf16":
            parts.append(f"precision={self.precision}")
        if self.placement != "tp-pp-dp":
            parts.append(f"placement={self.placement}")
        if self.overlap_step != "none":
            parts.append(f"overlap_step={self.overlap_step}")
        if self.explicit_layers and split:
            parts.append("layers=" + ":".join(map(str, self.layers)))
        if self.explicit_shares and split:
            parts.append("mb_shares=" + ":".join(map(str, self.mb_shares)))
        return ",".join(parts)


def parse_plan_string(text: str) -> dict:
    """'tp=8,pp=2,layers=10:14' -> {'tp': '8', 'pp': '2', 'layers': ['10', '14']}."""
    out: dict = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in item:
            raise InputError("--plan", None, f"{short(item)}: expected key=value (comma-separated)")
        key, value = (s.strip() for s in item.split("=", 1))
        if key in out:
            raise InputError("--plan", key[:60], "given twice")
        out[key] = value.split(":") if key in ("layers", "mb_shares") else value
    return out


def plan_world_size(plan: str | Path | dict) -> int:
    """Processes a plan asks for when it is run as written (the validator): tp*cp*pp*dp,
    with dp = 1 when the plan does not say."""
    raw, src = load_plan_mapping(plan)
    out = 1
    for key in ("tp", "cp", "pp", "dp"):
        v = raw.get(key, 1)
        n = int(v) if isinstance(v, str) and v.isdigit() else v  # plan strings carry text
        problem = number_problem(n, 1, MAX_DEVICES, integer=True)
        if problem:
            raise InputError(src, key, f"{short(v)}: {problem}")
        out *= n
    return out


def load_plan_mapping(plan: str | Path | dict) -> tuple[dict, str]:
    """A plan string, a YAML path or a mapping -> (raw mapping, source name for errors)."""
    if isinstance(plan, dict):
        return plan, "--plan"
    text = str(plan)
    path = Path(text)
    problem = not_a_file(path, "plan file") if text and "=" not in text else None
    if problem:
        raise InputError(text, "--plan", problem)
    if text.endswith((".yaml", ".yml")) or ("=" not in text and text and path.is_file()):
        if not path.is_file():
            raise InputError(text, "--plan", "no such plan file")
        return load_yaml_mapping(path, text, "plan file", "a mapping of plan fields (tp: 2, ...)"), text
    return parse_plan_string(text), "--plan"


def resolve_plan(plan: str | Path | dict, model: ModelSpec, num_devices: int,
                 gpus_per_node: int | None = None) -> Plan:
    """Validate a plan against the model and the device count; fill in every default."""
    raw, src = load_plan_mapping(plan)
    pf = validate(PlanFile, raw, src)

    tp, cp, pp, vpp = pf.tp, pf.cp, pf.pp, pf.vpp
    if num_devices % (tp * cp * pp):
        what = "tp*cp*pp" if cp > 1 else "tp*pp"
        raise InputError(src, what, f"{what} = {tp * cp * pp} does not divide the {num_devices} devices")
    dp = pf.dp if pf.dp is not None else num_devices // (tp * cp * pp)
    if tp * cp * pp * dp != num_devices:
        if cp > 1:
            raise InputError(src, "dp", f"tp*cp*pp*dp = {tp}*{cp}*{pp}*{dp} = {tp * cp * pp * dp}, "
                             f"but the cluster has {num_devices} devices")
        raise InputError(src, "dp", f"tp*pp*dp = {tp}*{pp}*{dp} = {tp * pp * dp}, "
                         f"but the cluster has {num_devices} devices")
    if model.num_attention_heads % tp:
        raise InputError(src, "tp", f"tp={tp} must divide num_attention_heads={model.num_attention_heads}")
    if model.kv_groups % tp and tp % model.kv_groups:
        raise InputError(src, "tp", f"tp={tp} and num_query_groups={model.kv_groups}: one must divide the other")
    if model.ffn % tp:
        raise InputError(src, "tp", f"tp={tp} must divide ffn_hidden_size={model.ffn}")

    if pf.sp and model.seq_length % tp:
        raise InputError(src, "sp", f"sequence parallelism needs tp={tp} to divide seq_length={model.seq_length}")
    check_cp(src, cp, pf.cp_comm, tp, pf.sp, model)

    schedule = pf.schedule or ("interleaved" if vpp > 1 else "1f1b")
    if schedule == "interleaved" and vpp < 2:
        raise InputError(src, "vpp", "schedule=interleaved needs vpp >= 2 model chunks per rank")
    if schedule != "interleaved" and vpp > 1:
        raise InputError(src, "schedule", f"vpp={vpp} needs schedule=interleaved (got {schedule})")
    if vpp > 1 and pp < 2:
        raise InputError(src, "vpp", "vpp > 1 needs pp >= 2")

    # Layers per stage.
    if pf.layers is not None:
        layers = tuple(pf.layers)
        if len(layers) != pp:
            raise InputError(src, "layers", f"needs {pp} entries (one per stage), got {len(layers)}")
        if sum(layers) != model.num_layers:
            raise InputError(src, "layers", f"entries sum to {sum(layers)}, model has {model.num_layers} layers")
        if any(n < vpp for n in layers):
            raise InputError(src, "layers", f"each stage needs at least vpp={vpp} layers")
    else:
        if model.num_layers % (pp * vpp):
            raise InputError(src, "pp", f"pp*vpp = {pp * vpp} does not divide num_layers={model.num_layers}; "
                             "give layers=N1:N2:... to split unevenly")
        layers = (model.num_layers // pp,) * pp

    # Microbatches per DP replica.
    total_mb, rem = divmod(model.global_batch_size, pf.mbs)
    if rem:
        raise InputError(src, "mbs", f"mbs={pf.mbs} must divide global_batch_size={model.global_batch_size}")
    if pf.mb_shares is not None:
        shares = tuple(pf.mb_shares)
        if len(shares) != dp:
            raise InputError(src, "mb_shares", f"needs {dp} entries (one per DP replica), got {len(shares)}")
        if sum(shares) != total_mb:
            raise InputError(src, "mb_shares", f"entries sum to {sum(shares)}; global_batch_size/mbs = {total_mb}")
    else:
        if total_mb < dp:
            raise InputError(src, "dp", f"global_batch_size/mbs = {model.global_batch_size}/{pf.mbs} = "
                             f"{total_mb} microbatches are fewer than dp={dp} replicas; lower mbs or dp, "
                             "or raise the global batch")
        if total_mb % dp:
            raise InputError(src, "dp", f"global_batch_size/mbs = {total_mb} microbatches "
                             f"do not split evenly over dp={dp}; give mb_shares=N1:N2:...")
        shares = (total_mb // dp,) * dp
    if schedule == "interleaved" and any(m % pp for m in shares):
        raise InputError(src, "schedule", f"interleaved needs microbatches per replica "
                         f"({', '.join(map(str, sorted(set(shares))))}) divisible by pp={pp}")
    # zero=3 combines with tp, cp and pp (TorchTitan's FSDP2 + TP + PP): the engine gathers
    # each layer's weights before every forward and backward, prefetching the next layer
    # (sim/pipeline_executor._LayerGathers; docs/context-parallelism.md).
    if pf.overlap_step != "none" and pf.zero == 3:
        raise InputError(src, "overlap_step", f"{pf.overlap_step} needs zero < 3 (ZeRO-3 gathers and "
                         "reduce-scatters per microbatch, inside the step)")

    return Plan(
        tp=tp, pp=pp, dp=dp, mbs=pf.mbs, vpp=vpp, schedule=schedule, sp=pf.sp,
        recompute=pf.recompute, zero=pf.zero, overlap_grad_reduce=pf.overlap_grad_reduce,
        compress=pf.compress, allreduce=pf.allreduce, precision=pf.precision,
        placement=pf.placement, layers=layers, mb_shares=shares, cp=cp,
        cp_comm=pf.cp_comm if cp > 1 else "ring",  # meaningless without cp; keeps to_string exact
        explicit_layers=pf.layers is not None, explicit_shares=pf.mb_shares is not None,
        overlap_step=pf.overlap_step,
    )


def check_cp(src: str, cp: int, cp_comm: str, tp: int, sp: bool, model: ModelSpec) -> None:
    """Context parallelism's shape rules, each a one-line InputError.

    Causal load balancing splits every sequence into 2*cp chunks and gives rank r chunks
    r and 2*cp-1-r, so each rank does the same causal work (Megatron-Core's rope and batch
    splitting use that layout: megatron/core/models/common/embeddings/rope_utils.py,
    `[cp_rank, 2 * cp_size - cp_rank - 1]`); seq_length must therefore split into 2*cp
    equal chunks. Sequence parallelism then splits each rank's seq/cp tokens over tp.
    The all-to-all variant (DeepSpeed-Ulysses, Jacobs et al. 2023, arXiv:2309.14509 sec. 3)
    scatters attention heads over the cp ranks, so tp*cp must divide the heads."""
    if cp == 1:
        return
    seq = model.seq_length
    if seq % (2 * cp):
        raise InputError(src, "cp", f"cp={cp} needs seq_length={seq} to split into 2*cp = {2 * cp} "
                         "equal chunks (causal load balancing)")
    if sp and (seq // cp) % tp:
        raise InputError(src, "sp", f"sequence parallelism with cp={cp} needs tp={tp} to divide "
                         f"seq_length/cp = {seq // cp}")
    if cp_comm == "a2a" and model.num_attention_heads % (tp * cp):
        raise InputError(src, "cp_comm", f"cp_comm=a2a scatters heads: tp*cp = {tp * cp} must divide "
                         f"num_attention_heads={model.num_attention_heads}")
    # The K/V heads too: Transformer Engine's all-to-all attention asserts both Q's and K's
    # heads per rank divisible by cp (transformer_engine/pytorch/attention/
    # dot_product_attention/context_parallel.py, AttnFuncWithCPAndQKVOA2A: "The number of
    # attention heads needs to be divisible by CP size!"). A TP rank holds kv_groups/tp K/V
    # heads, or one copy when tp exceeds kv_groups.
    kv_per_rank = max(model.kv_groups // tp, 1)
    if cp_comm == "a2a" and kv_per_rank % cp:
        raise InputError(src, "cp_comm", f"cp_comm=a2a scatters K/V heads too: cp={cp} must divide the "
                         f"{kv_per_rank} K/V head(s) per TP rank (num_query_groups={model.kv_groups}, "
                         f"tp={tp}); use cp_comm=ring")
