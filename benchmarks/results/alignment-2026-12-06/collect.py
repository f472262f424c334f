"""Collect the held-out evaluations of the alignment trial's runs into results.json (and print a table).

Usage: python collect.py NAME...  (runs under ~/.cache/specprim/align-trial/NAME, see run.sh / hass_trial.py)
"""
import json
import sys
from pathlib import Path

trial = Path.home() / ".cache/specprim/align-trial"
start = json.loads(Path("start.json").read_text())  # the shipped head on the same held-out shard (eval.jsonl line 1)
results = {"start": start}
for name in sys.argv[1:]:
    lines = [json.loads(line) for line in (trial / name / "run" / "log.jsonl").read_text().splitlines()]
    final = [r for r in lines if r.get("eval")][-1]
    results[name] = {k: round(v, 4) for k, v in final.items() if k.startswith(("acc_", "chain_", "step"))}
for name, r in results.items():
    r["chain_tau"] = round(1 + sum(v for k, v in r.items() if k.startswith("chain_")), 4)
    print(f"{name:12} acc {r['acc_1']:.3f} / {r['acc_2']:.3f} / {r['acc_3']:.3f}   "
          f"chain {r['chain_1']:.3f} / {r['chain_2']:.3f} / {r['chain_3']:.3f}   tau {r['chain_tau']:.3f}")
Path("results.json").write_text(json.dumps(results, indent=1) + "\n")
