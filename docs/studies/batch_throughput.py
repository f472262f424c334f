"""Throughput of batched speculative decoding against batched ``model.generate``.

For every batch size ``B``, the first ``B`` MT-bench first turns (chat template, left-padded) are generated
greedily for ``--max-new-tokens`` tokens by: batched ``model.generate`` ("plain"), batched
``specprim.speculative_generate`` with the shipped EAGLE-3 head (one drafter per row sharing the head), and
with prompt lookup. Runs are interleaved (the method order rotates every repeat) after one warm-up run of each
method. Throughput counts the tokens each row really generated (up to and including its end-of-sequence token)
over the wall time of the whole batched call. Writes a markdown table and the raw records as JSON.

    python docs/studies/batch_throughput.py --batch-sizes 1 2 4 8 16 --max-new-tokens 64 --dtype float32
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

import specprim
from specprim import presets
from specprim.bench import load_dataset
from specprim.drafters import PromptLookup
from specprim.hf import chat_input_ids
from specprim.trees import DynamicTree

MODEL = "smollm2-135m-instruct"
HEAD = "smollm2-135m-instruct-eagle3"
METHODS = ("plain", "eagle3", "prompt-lookup", "eagle3-small", "prompt-lookup-small")
DEFAULT_METHODS = ("plain", "eagle3", "prompt-lookup")
SMALL_TREE = DynamicTree(depth=1, top_k=3, budget=3)  # "eagle3-small": what `specprim tune` chose here (bf16, B = 1)


def left_pad(prompts: list[torch.Tensor], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) ids and attention mask of 1-D ``prompts``, padded on the left with ``pad``."""
    width = max(p.shape[0] for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - prompt.shape[0] :] = prompt
        mask[row, width - prompt.shape[0] :] = 1
    return ids, mask


def generated_rows(sequences: torch.Tensor, width: int, eos: set[int]) -> list[list[int]]:
    """Each row's generated tokens after column ``width``, cut after its first end-of-sequence token."""
    rows = []
    for row in sequences[:, width:].tolist():
        cut = next((i + 1 for i, token in enumerate(row) if token in eos), len(row))
        rows.append(row[:cut])
    return rows


def run(method: str, target, head, ids, mask, max_new_tokens: int, eos: list[int]) -> dict:
    """One batched generation; returns the generated rows, wall seconds and speculative statistics."""
    batch = ids.shape[0]
    start = time.perf_counter()
    if method == "plain":
        with torch.no_grad():
            sequences = target.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                                        eos_token_id=eos, pad_token_id=eos[0])
        seconds = time.perf_counter() - start
        return {"rows": generated_rows(sequences, ids.shape[1], set(eos)), "seconds": seconds}
    make = {
        "eagle3": lambda: presets.eagle3(head).drafter,  # the head's default tree: DynamicTree(5, 8, 40)
        "eagle3-small": lambda: presets.eagle3(head, tree=SMALL_TREE).drafter,
        "prompt-lookup": lambda: presets.prompt_lookup().drafter,  # up to 4 matches of 8 tokens
        "prompt-lookup-small": lambda: PromptLookup(num_tokens=4, max_matches=1),  # a chain of 4
    }[method]
    drafters = [make() for _ in range(batch)]
    start = time.perf_counter()
    out = specprim.speculative_generate(target, ids, mask, drafter=drafters, acceptance=specprim.acceptance.Greedy(),
                                        max_new_tokens=max_new_tokens, eos_token_id=eos)
    seconds = time.perf_counter() - start
    return {
        "rows": generated_rows(out.sequences, ids.shape[1], set(eos)), "seconds": seconds, "tau": out.stats.tau,
        "forwards": out.forwards, "draft_s": out.stats.draft_s, "verify_s": out.stats.verify_s,
        "other_s": out.stats.other_s, "verify_utilization": utilization(out.row_stats, out.forwards),
    }


def utilization(row_stats, forwards: int) -> float:
    """Fraction of the verified positions that were real (a root or a drafted node) rather than dummy nodes
    padding a row's tree to the step's largest tree: sum of (1 + N_b) over sum of B_step * (1 + max N_b)."""
    real = padded = 0
    for step in range(forwards):
        sizes = [s.tree_nodes[step] + 1 for s in row_stats if s.steps > step]
        real, padded = real + sum(sizes), padded + len(sizes) * max(sizes)
    return real / padded if padded else 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(DEFAULT_METHODS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/batch_throughput"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, tokenizer = specprim.models.load(MODEL, dtype=getattr(torch, args.dtype))
    head = presets.from_name("eagle3", target=target, head=HEAD).drafter.model.head
    eos = target.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos)
    prompts = [chat_input_ids(tokenizer, p.turns[0])[0] for p in load_dataset("mt-bench", max(args.batch_sizes))]
    for method in args.methods:  # warm-up
        ids, mask = left_pad(prompts[:1], eos[0])
        run(method, target, head, ids, mask, 8, eos)
    records = []
    for batch in args.batch_sizes:
        ids, mask = left_pad(prompts[:batch], eos[0])
        for repeat in range(args.repeats):
            order = args.methods[repeat % len(args.methods):] + args.methods[: repeat % len(args.methods)]
            results = {m: run(m, target, head, ids, mask, args.max_new_tokens, eos) for m in order}
            plain_rows = results.get("plain", {}).get("rows")
            for method, result in results.items():
                tokens = sum(len(r) for r in result["rows"])
                record = {
                    "batch": batch, "method": method, "repeat": repeat, "dtype": args.dtype,
                    "new_tokens": tokens, "seconds": result["seconds"], "tokens_per_s": tokens / result["seconds"],
                    "rows_identical_to_plain": None if plain_rows is None else sum(
                        a == b for a, b in zip(result["rows"], plain_rows, strict=True)),
                    **{k: v for k, v in result.items() if k not in ("rows", "seconds")},
                }
                records.append(record)
                print(json.dumps(record), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"model": MODEL, "head": HEAD, "max_new_tokens": args.max_new_tokens, "dtype": args.dtype,
            "threads": args.threads, "repeats": args.repeats, "torch": torch.__version__,
            "machine": platform.processor() or platform.machine()}
    args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "records": records}, indent=1))
    args.out.with_suffix(".md").write_text(table(records, args))
    print(table(records, args))


def table(records: list[dict], args: argparse.Namespace) -> str:
    """Markdown: one line per batch size, tokens/s (median over repeats) of each method, speedup over plain."""
    def median(values):
        values = sorted(values)
        return values[len(values) // 2]

    lines = [f"{MODEL}, {args.dtype}, greedy, {args.max_new_tokens} new tokens, MT-bench first turns, "
             f"{args.threads} threads, median of {args.repeats} interleaved repeat(s)", ""]
    header = "| B |" + "".join(f" {m} tok/s |" for m in args.methods)
    header += "".join(f" {m} speedup | {m} tau | {m} util | {m} rows = plain |" for m in args.methods if m != "plain")
    lines += [header, "|" + "---|" * (header.count("|") - 1)]
    for batch in args.batch_sizes:
        rows = {m: [r for r in records if r["batch"] == batch and r["method"] == m] for m in args.methods}
        speed = {m: median([r["tokens_per_s"] for r in rows[m]]) for m in args.methods}
        line = f"| {batch} |" + "".join(f" {speed[m]:.1f} |" for m in args.methods)
        for m in args.methods:
            if m == "plain":
                continue
            ratio = f"{speed[m] / speed['plain']:.2f}x" if "plain" in speed else "-"
            same = rows[m][0]["rows_identical_to_plain"]
            line += (f" {ratio} | {median([r['tau'] for r in rows[m]]):.2f} | "
                     f"{median([r.get('verify_utilization', float('nan')) for r in rows[m]]):.2f} | {same}/{batch} |")
        lines.append(line)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
