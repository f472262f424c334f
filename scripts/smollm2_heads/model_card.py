"""Write a shipped head's bf16 weights and its model card from a finished run and a bench result.

Usage: python model_card.py RUN_DIR HEAD_NAME BENCH_JSON [BENCH_JSON ...] --command "..." --bench-command "..."
"""

import argparse
import json
from pathlib import Path

import torch

from specprim.models import load, load_head
from specprim.models._heads import HEADS_DIR


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run", type=Path, help="the run directory (specprim train --out X: X/run)")
    parser.add_argument("name")
    parser.add_argument("bench", type=Path, nargs="+")
    parser.add_argument("--command", required=True)
    parser.add_argument("--bench-command", action="append", required=True)
    parser.add_argument("--notes", default="")
    parser.add_argument("--limits", default="")
    args = parser.parse_args()
    target, _ = load("smollm2-135m-instruct")
    head = load_head(args.run / "head", target).to(torch.bfloat16)
    out = HEADS_DIR / args.name
    head.save_pretrained(out)
    settings = json.loads((args.run / "settings.json").read_text())
    manifest = json.loads((Path(settings["features"]) / "manifest.json").read_text())
    lines = [json.loads(line) for line in (args.run / "log.jsonl").read_text().splitlines()]
    steps = [line for line in lines if not line.get("eval")]
    final_eval = [line for line in lines if line.get("eval")][-1]
    params = sum(p.numel() for p in head.parameters())
    size = sum(f.stat().st_size for f in out.iterdir())
    depth_acc = ", ".join(f"{final_eval[k]:.3f}" for k in sorted(final_eval) if k.startswith("acc_"))
    bench_rows = []
    for path in args.bench:
        data = json.loads(path.read_text())
        meta = data["meta"]["settings"]
        for summary in data["results"]:
            if summary["method"] == "hf":
                continue
            bench_rows.append(
                f"| {summary['method']} | {meta['dataset']} ({meta['num_prompts']} prompts, turns={meta.get('turns')}) "
                f"| {meta['max_new_tokens']} | {meta['temperature']} | {meta['dtype']} | {summary['tau']:.2f} "
                f"| {summary['speedup']:.2f}x | {summary.get('identical')} ({summary.get('identical_rows')} rows) |"
            )
    data_row = (
        f"{manifest['num_examples']} conversations, {manifest['num_tokens']:,} tokens (max "
        f"{settings['data']['max_length']} per conversation), {settings['data']['holdout']} held out; labels: the "
        f"target's top-{manifest['top_k']} next-token distribution at every position (bfloat16 target)"
    )
    optimisation_row = (
        f"{final_eval['step']} steps, {steps[-1]['tokens']:,} tokens seen by step {steps[-1]['step']} "
        f"({steps[-1]['epoch'] + 1} epoch(s) started), {steps[-1]['train_seconds'] / 60:.0f} min of training "
        "on 2 CPU cores"
    )
    card = f"""# {args.name}

A `{type(head).__name__}` draft head for **SmolLM2-135M-Instruct** (`specprim.models.load("smollm2-135m-instruct")`),
trained with `specprim train`. Load it by name: `specprim.models.load_head("{args.name}", target)`, or
`--method {settings['kind'] if settings['kind'] != 'eagle3' else 'eagle3'} --head {args.name}` on the command line.

| | |
|---|---|
| head config | `{json.dumps(json.loads((out / 'config.json').read_text())['config'])[:600]}` |
| parameters (own) | {params / 1e6:.2f} M, stored in bfloat16 ({size / 2**20:.1f} MiB on disk) |
| training data | {data_row} |
| optimisation | {optimisation_row} |
| held-out teacher-forced top-1 agreement with the target, by draft depth | {depth_acc} |

## Data

{args.notes}

## Command

```bash
{args.command}
```

## Measured with `specprim bench`

| method | prompts | new tokens | temperature | dtype | tau | speedup vs `model.generate` | identical (greedy) |
|---|---|---|---|---|---|---|---|
{chr(10).join(bench_rows)}

```bash
{chr(10).join(args.bench_command)}
```

{args.limits}

tau is the mean number of tokens per target forward, the bonus token included. Speedups are measured on a
2-core CPU shared with other jobs and move by about 10 % between runs; tau does not depend on the machine.
"""
    (out / "README.md").write_text(card)
    print(card)


if __name__ == "__main__":
    main()
