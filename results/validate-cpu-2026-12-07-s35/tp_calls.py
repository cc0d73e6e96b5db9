"""Per run: tp=2's (trace 2) and tp=2 x dp=2's (trace 6) measured TP call durations, rank 0/1."""
import json, statistics, sys, pathlib
for r in sys.argv[1:]:
    out = []
    for t in (2, 6):
        f = pathlib.Path(r) / "traces" / f"trace-{t}-measured.json"
        if not f.exists():
            f = pathlib.Path(r) / "report" / f"trace-{t}-measured.json"
        d = json.loads(f.read_text()); ev = d["traceEvents"] if isinstance(d, dict) else d
        durs = [e["dur"] / 1e3 for e in ev if e.get("ph") == "X" and e.get("name", "").startswith("tp ") and e.get("pid") in (0, 1)]
        out.append(f"trace {t}: {len(durs)} calls, median {statistics.median(durs):.2f} ms, mean {statistics.mean(durs):.2f} ms")
    print(pathlib.Path(r).name, " | ".join(out))
