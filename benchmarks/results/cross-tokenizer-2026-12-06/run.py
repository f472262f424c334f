"""Cross-tokenizer drafting on HumanEval: Qwen2.5-Coder-1.5B-Instruct verified, drafted by SmolLM2-135M-Instruct
(another tokenizer, shared tokens only) or by Qwen2.5-Coder-0.5B-Instruct (same tokenizer), against Hugging Face's
universal assisted generation with the SmolLM2 draft. Greedy, 64 new tokens,
bfloat16 (linears pre-packed: the same numbers, faster kernels), CPU.

tokens_per_forward = new tokens / target forwards, the prefill included (counted by a forward hook for every method,
so Hugging Face's assisted generation is measured the same way); specprim's own tau (GenerationStats.tau, steps after
the prefill) is recorded beside it. Run it with nothing else on the machine: the timings are compared as ratios.
A method that raises (Hugging Face's universal assisted generation can) is recorded per prompt with its error.

    python benchmarks/results/cross-tokenizer-2026-12-06/run.py --prompts 10 --format chat \
        --out benchmarks/results/cross-tokenizer-2026-12-06/chat
    python benchmarks/results/cross-tokenizer-2026-12-06/run.py --prompts 10 --format completion \
        --out benchmarks/results/cross-tokenizer-2026-12-06/completion
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from specprim import models, presets
from specprim.bench import load_dataset
from specprim.drafters import CrossVocab
from specprim.hf import chat_input_ids

TARGET, SAME_DRAFT, OTHER_DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"


class ForwardCounter:
    def __init__(self, model: torch.nn.Module) -> None:
        self.calls = 0
        model.register_forward_hook(self._hook)

    def _hook(self, *_: object) -> None:
        self.calls += 1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--methods", default="plain,cross,same,hf-uag")
    parser.add_argument("--format", choices=("chat", "completion"), default="chat",
                        help="chat: the prompt in the target's chat template; completion: the code prompt as is")
    args = parser.parse_args()
    torch.set_num_threads(2)
    target, tokenizer = models.load(TARGET, dtype=torch.bfloat16, pack=True)
    counter = ForwardCounter(target)
    other, other_tokenizer = models.load(OTHER_DRAFT, dtype=torch.bfloat16, pack=True)
    start = time.perf_counter()
    vocab = CrossVocab(tokenizer, other_tokenizer)
    vocab_s = time.perf_counter() - start
    methods = args.methods.split(",")
    same = models.load(SAME_DRAFT, dtype=torch.bfloat16, pack=True)[0] if "same" in methods else None
    prompts = load_dataset("humaneval", args.prompts)
    rows = []
    for prompt in prompts:
        if args.format == "chat":
            ids = chat_input_ids(tokenizer, prompt.turns[0])  # (1, T)
        else:
            ids = tokenizer(prompt.turns[0], return_tensors="pt").input_ids  # (1, T)
        row = {"id": prompt.id, "prompt_tokens": ids.shape[1]}
        outputs = {}
        for method in methods:
            counter.calls = 0
            start = time.perf_counter()
            if method == "plain":
                seq = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                      max_new_tokens=args.max_new_tokens)
            elif method in ("cross", "same"):
                draft = presets.leviathan(other, k=args.k, cross_vocab=vocab) if method == "cross" else \
                    presets.leviathan(same, k=args.k)
                out = draft.generate(target, ids, max_new_tokens=args.max_new_tokens)
                seq = out.sequences
                row[f"{method}_stats_tau"] = out.stats.tau
            else:  # Hugging Face universal assisted generation, its defaults
                try:
                    seq = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                          max_new_tokens=args.max_new_tokens, assistant_model=other,
                                          tokenizer=tokenizer, assistant_tokenizer=other_tokenizer)
                except RuntimeError as error:  # transformers' own failure, recorded as such
                    row[method] = {"error": str(error).splitlines()[0]}
                    continue
            seconds = time.perf_counter() - start
            new = seq.shape[1] - ids.shape[1]
            row[method] = {"new_tokens": new, "target_forwards": counter.calls, "seconds": seconds,
                           "tokens_per_s": new / seconds, "tokens_per_forward": new / counter.calls}
            outputs[method] = seq[0, ids.shape[1]:].tolist()
        if "plain" in outputs:
            row["equal_to_plain"] = {m: outputs[m] == outputs["plain"] for m in outputs if m != "plain"}
        row["outputs_equal"] = {f"{a}={b}": a in outputs and outputs.get(a) == outputs.get(b)
                                for i, a in enumerate(methods) for b in methods[i + 1:]}
        rows.append(row)
        print(json.dumps(row), flush=True)
        write(args, vocab, vocab_s, methods, rows)  # after every prompt: a run cut short keeps what it measured


def write(args: argparse.Namespace, vocab: CrossVocab, vocab_s: float, methods: list[str], rows: list[dict]) -> None:
    summary = {"format": args.format, "vocab": repr(vocab), "vocab_build_s": vocab_s, "k": args.k,
               "max_new_tokens": args.max_new_tokens, "prompts": len(rows),
               "machine": "2 CPU cores: compare timings only from a quiet machine",
               "methods": methods}
    for method in methods:
        failed = [r for r in rows if "error" in r[method]]
        done = [r for r in rows if "error" not in r[method]]
        if not done:
            summary[method] = {"failed_prompts": len(failed), "error": failed[0][method]["error"]}
            continue
        new = sum(r[method]["new_tokens"] for r in done)
        forwards = sum(r[method]["target_forwards"] for r in done)
        seconds = sum(r[method]["seconds"] for r in done)
        taus = [r[f"{method}_stats_tau"] for r in rows if f"{method}_stats_tau" in r]
        summary[method] = {"tokens_per_forward": new / forwards, "new_tokens": new, "target_forwards": forwards,
                           "mean_stats_tau": sum(taus) / len(taus) if taus else None,
                           "tokens_per_s": new / seconds, "failed_prompts": len(failed),
                           "equal_to_plain": sum(r.get("equal_to_plain", {}).get(method, False) for r in rows)}
    pairs = rows[0]["outputs_equal"] if rows else {}
    summary["outputs_equal"] = {pair: sum(r["outputs_equal"][pair] for r in rows) for pair in pairs}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
