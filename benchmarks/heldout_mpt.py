"""Held-out check: llm-foundry's published MPT throughput table, predicted by plansim.

    python3 benchmarks/heldout_mpt.py [--json OUT]

Source of the measured figures: mosaicml/llm-foundry, scripts/train/benchmarking/README.md
(tables of commit 5e85bd62): MPT models 125M-70B trained with Composer's FSDP
(FULL_SHARD), bf16, on A100 80 GB, A100 40 GB and H100 80 GB nodes of 8 GPUs, with the
microbatch, gradient accumulation, global batch, sequence length and activation
checkpointing of each row, and the measured tokens/s per GPU. The model shapes are the
llm-foundry pretraining YAMLs (scripts/train/yamls/pretrain/mpt-*.yaml, commit 8c8dd48f):
GELU MLP of 4h, tied embeddings, no biases, LayerNorm, vocabulary 50368. MPT uses ALiBi,
which has no field here: `position_embedding: rope` stands in (no parameters, as ALiBi;
not the same kernel, which is why long sequences are a known limit in the README).

Nothing in plansim was fitted to these rows. Every row is simulated as a user would: the
bundled DGX A100 / DGX H100 topology (a 40 GB variant of DGX A100 for the B rows), ZeRO-3
over all GPUs (FSDP full shard), `recompute=full` where the row checkpoints activations,
the bundled `torchtitan` runtime (PyTorch FSDP, FlashAttention). The error is predicted
step time over measured (measured tokens/s / predicted tokens/s - 1): negative = plansim
too fast. Prints one line per row, then the mean and median |error|, by sequence length.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# name: (layers, hidden, heads, ffn) of llm-foundry's mpt-<name>.yaml
MODELS = {
    "125m": (12, 768, 12, 3072), "350m": (24, 1024, 16, 4096), "760m": (24, 1536, 12, 6144),
    "1b": (24, 2048, 16, 8192), "3b": (32, 2560, 20, 10240), "7b": (32, 4096, 32, 16384),
    "13b": (40, 5120, 40, 20480), "30b": (48, 7168, 56, 28672), "70b": (80, 8192, 64, 32768),
}
VOCAB = 50368

# (row, table, model, seq, GPUs, microbatch, global batch, activation checkpointing,
#  measured tokens/s per GPU), in the source's order.
ROWS = [
    ("A1", "A100-80GB", "125m", 2048, 8, 40, 640, False, 142830),
    ("A2", "A100-80GB", "125m", 65536, 8, 1, 16, False, 20368),
    ("A3", "A100-80GB", "350m", 2048, 8, 32, 512, False, 58782),
    ("A4", "A100-80GB", "760m", 2048, 8, 24, 384, False, 32434),
    ("A5", "A100-80GB", "760m", 512, 8, 96, 1536, False, 29446),
    ("A6", "A100-80GB", "1b", 2048, 8, 14, 448, False, 20513),
    ("A7", "A100-80GB", "1b", 32768, 8, 1, 32, False, 6275),
    ("A8", "A100-80GB", "3b", 2048, 8, 10, 160, False, 10811),
    ("A9", "A100-80GB", "3b", 16384, 8, 1, 48, False, 5529),
    ("A10", "A100-80GB", "3b", 65536, 8, 1, 16, True, 1767),
    ("A11", "A100-80GB", "7b", 2048, 8, 6, 96, False, 4641),
    ("A12", "A100-80GB", "7b", 8192, 8, 8, 128, True, 3206),
    ("A13", "A100-80GB", "7b", 65536, 8, 1, 16, True, 1013),
    ("A14", "A100-80GB", "13b", 2048, 8, 2, 48, False, 2262),
    ("A15", "A100-80GB", "13b", 1024, 8, 40, 960, True, 2330),
    ("A16", "A100-80GB", "13b", 32768, 8, 1, 24, True, 1016),
    ("A17", "A100-80GB", "30b", 2048, 8, 3, 504, True, 916),
    ("A18", "A100-80GB", "30b", 8192, 8, 1, 168, True, 574),
    ("A19", "A100-80GB", "70b", 2048, 64, 8, 2048, True, 410),
    ("A20", "A100-80GB", "70b", 2048, 32, 2, 1024, True, 373),
    ("B1", "A100-40GB", "7b", 2048, 8, 12, 384, True, 3679),
    ("B2", "A100-40GB", "7b", 2048, 128, 18, 2304, True, 3623),
    ("B3", "A100-40GB", "125m", 2048, 8, 26, 624, False, 136334),
    ("B4", "A100-40GB", "125m", 2048, 128, 26, 3328, False, 123936),
    ("B5", "A100-40GB", "30b", 2048, 32, 4, 128, True, 857),
    ("B6", "A100-40GB", "30b", 2048, 128, 6, 768, True, 865),
    ("B7", "A100-40GB", "70b", 2048, 128, 4, 512, True, 376),
    ("H1", "H100-80GB", "1b", 2048, 64, 20, 1280, False, 44402),
    ("H2", "H100-80GB", "7b", 2048, 8, 6, 48, False, 10643),
    ("H3", "H100-80GB", "7b", 65536, 8, 1, 16, True, 1956),
    ("H4", "H100-80GB", "13b", 2048, 8, 2, 16, False, 4792),
    ("H5", "H100-80GB", "30b", 2048, 8, 3, 504, True, 2002),
    ("H6", "H100-80GB", "70b", 2048, 512, 8, 4096, True, 1007),
]


def model_yaml(name: str) -> str:
    layers, hidden, heads, ffn = MODELS[name]
    return (f"name: mpt-{name}\nnum_layers: {layers}\nhidden_size: {hidden}\nnum_attention_heads: {heads}\n"
            f"ffn_hidden_size: {ffn}\nseq_length: 2048\nvocab_size: {VOCAB}\nglobal_batch_size: 256\n"
            "activation: gelu\ntie_embeddings: true\nposition_embedding: rope\nlinear_bias: false\n"
            "normalization: layernorm\n")


def topology_40gb() -> str:
    """The bundled DGX A100 with A100-SXM4-40GB (the B rows' machines), otherwise the same."""
    text = (ROOT / "topologies" / "dgx-a100.yaml").read_text()
    for a, b in (("name: dgx-a100\n", "name: dgx-a100-40gb\n"), ("A100-SXM4-80GB", "A100-SXM4-40GB"),
                 ("  dgx-a100:\n", "  dgx-a100-40gb:\n"), ("node_type: dgx-a100,", "node_type: dgx-a100-40gb,")):
        if a not in text:
            raise SystemExit(f"topologies/dgx-a100.yaml changed: {a.strip()!r} not found")
        text = text.replace(a, b)
    return text


def simulate_step_s(args: list[str], what: str) -> float:
    """Step time of `plansim simulate ARGS --json`, run as a user runs it; a failure ends
    the benchmark naming ``what`` and the command."""
    cmd = [sys.executable, "-m", "plansim", "simulate", *args, "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if out.returncode:
        raise SystemExit(f"{what}: {' '.join(cmd)}: {out.stderr.strip()}")
    return float(json.loads(out.stdout)["step_time_s"])


def json_out(argv: list[str]) -> Path | None:
    """The file after --json, if given."""
    i = argv.index("--json") + 1 if "--json" in argv else 0
    return Path(argv[i]) if 0 < i < len(argv) else None


def save_rows(out_json: Path | None, rows: list[dict]) -> int:
    """Write the rows to --json's file when given; the exit code."""
    if out_json:
        out_json.write_text(json.dumps(rows, indent=2))
    return 0


def predict(tmp: Path, row) -> dict:
    rid, table, model, seq, gpus, mbs, gb, ac, measured = row
    topo = {"A100-80GB": "dgx-a100", "H100-80GB": "dgx-h100", "A100-40GB": str(tmp / "dgx-a100-40gb.yaml")}[table]
    plan = f"dp={gpus},zero=3,mbs={mbs}" + (",recompute=full" if ac else "")
    step = simulate_step_s([topo, "--nodes", str(gpus // 8), "--model", str(tmp / f"mpt-{model}.yaml"),
                            "--seq", str(seq), "--global-batch", str(gb), "--plan", plan, "--runtime", "torchtitan"], rid)
    predicted = seq * gb / step / gpus
    return {"row": rid, "table": table, "model": f"mpt-{model}", "seq": seq, "gpus": gpus,
            "measured_tokens_per_s_per_gpu": measured, "predicted_tokens_per_s_per_gpu": predicted,
            "error_pct": 100.0 * (measured / predicted - 1.0), "plan": plan}


def main(argv: list[str]) -> int:
    out_json = json_out(argv)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for name in MODELS:
            (tmp / f"mpt-{name}.yaml").write_text(model_yaml(name))
        (tmp / "dgx-a100-40gb.yaml").write_text(topology_40gb())
        rows = []
        for row in ROWS:
            r = predict(tmp, row)
            rows.append(r)
            print(f"{r['row']:4s} {r['table']:10s} {r['model']:9s} seq {r['seq']:>6} {r['gpus']:>4} GPUs  "
                  f"measured {r['measured_tokens_per_s_per_gpu']:>8.0f}  predicted "
                  f"{r['predicted_tokens_per_s_per_gpu']:>9.0f} tokens/s/GPU  step time {r['error_pct']:+6.1f} %",
                  flush=True)
    errs = [abs(r["error_pct"]) for r in rows]
    short = [abs(r["error_pct"]) for r in rows if 1024 <= r["seq"] <= 2048]
    long_ = [r["error_pct"] for r in rows if r["seq"] > 2048]
    print(f"\n{len(rows)} rows: mean |error| {statistics.fmean(errs):.1f} %, median {statistics.median(errs):.1f} %; "
          f"seq 1k-2k: {len(short)} rows, mean |error| {statistics.fmean(short):.1f} %; "
          f"seq > 2k: {min(long_):+.1f} to {max(long_):+.1f} %")
    return save_rows(out_json, rows)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
