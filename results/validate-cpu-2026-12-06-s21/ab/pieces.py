"""Per-microbatch forward and backward seconds the cost model gives tiny's chunks (dp=2 rank,
pp=2 stage 0, stage 1, layers only) with a calibrated profile: python3 pieces.py PROFILE."""
import sys
from pathlib import Path
from specs.model import load_model
from specs.plan import resolve_plan
from specs.topology import load_topology
from costmodel.profile import load_profile
from sim.program import chunk_work
prof = load_profile(sys.argv[1])
m = load_model("tiny")
cl = load_topology(str(Path(__file__).with_name("localhost-cpu-2.yaml")))
for ptxt, layers, first, last in [("tp=1,pp=1,dp=2,mbs=1,precision=fp32", 4, True, True),
                                  ("tp=1,pp=2,dp=1,mbs=1,precision=fp32", 2, True, False),
                                  ("tp=1,pp=2,dp=1,mbs=1,precision=fp32", 2, False, True),
                                  ("tp=1,pp=2,dp=1,mbs=1,precision=fp32", 2, False, False)]:
    plan = resolve_plan(ptxt, m, 2)
    w = chunk_work(m, plan, cl, prof, 0, layers, first, last)
    print(ptxt.split(",mbs")[0], layers, first, last, {k: round(getattr(w, k) * 1e3, 3) for k in ("fwd_s", "bwd_s") if hasattr(w, k)})
