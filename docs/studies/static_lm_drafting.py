"""Drafting with an independent draft model, eagerly and through static, compiled draft models (with the whole
vocabulary and a reduced one), against Hugging Face's assisted generation with the same pair: one interleaved
``specprim bench`` run (the CLI's ``--static-draft`` / ``--draft-vocab`` switch every method at once; this script
puts the variants side by side as custom methods).

    python docs/studies/static_lm_drafting.py --json /tmp/static_lm_drafting.json
    python docs/studies/static_lm_drafting.py --no-whole-vocabulary   # less memory: one static draft model

Each static draft model compiles three padded sizes first (about 1 minute each for Qwen2.5-Coder-0.5B on 2 cores)
and holds a copy of the draft's weights per size (see docs/generate.md); verification is the target's eager,
packed forward (a static, compiled 1.5B target beside two static drafts does not fit in 24 GB).
"""

from __future__ import annotations

import argparse
import sys

import torch

from specprim import bench, models, presets
from specprim.acceptance import SpeculativeSampling
from specprim.drafters import ModelDrafter, lm_draft_vocab, static_drafting
from specprim.hf import chat_input_ids
from specprim.trees import Chain


def cache_length(tokenizer, prompts: list[bench.Prompt], max_new_tokens: int) -> int:  # noqa: ANN001
    """A static cache long enough for every conversation (each user turn rendered alone plus ``max_new_tokens``,
    an upper bound), plus 64 (the largest padded tree), so that no draft cache grows during the timed runs."""
    return max(sum(chat_input_ids(tokenizer, turn).shape[1] + max_new_tokens for turn in p.turns)
               for p in prompts) + 64


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--dataset", default="humaneval")
    parser.add_argument("--num-prompts", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--num-draft", type=int, default=4)
    parser.add_argument("--draft-vocab", type=int, default=32768)
    parser.add_argument("--no-whole-vocabulary", action="store_true",
                        help="leave out the static draft over the whole vocabulary")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, tokenizer = models.load(args.target, dtype=torch.bfloat16, pack=True)
    draft, _ = models.load(args.draft, dtype=torch.bfloat16, pack=True)
    prompts = bench.load_dataset(args.dataset, args.num_prompts)
    length = cache_length(tokenizer, prompts, args.max_new_tokens)

    def static(d2t: torch.Tensor | None) -> presets.Method:
        drafter = ModelDrafter(draft, Chain(args.num_draft), d2t=d2t)
        return presets.Method(static_drafting(drafter, min_cache_length=length), SpeculativeSampling())

    custom = {} if args.no_whole_vocabulary else {"leviathan-static": static(None)}
    custom[f"leviathan-static-{args.draft_vocab}"] = static(lm_draft_vocab(draft, args.draft_vocab))
    results = bench.run(target=target, tokenizer=tokenizer, draft=draft, methods=["hf-assisted", "leviathan"],
                        custom=custom, dataset=args.dataset, num_prompts=args.num_prompts,
                        max_new_tokens=args.max_new_tokens, dtype="bfloat16", pack=True, num_draft=args.num_draft,
                        warmup_tokens=args.max_new_tokens, json_path=args.json, argv=sys.argv)
    print(results.markdown())


if __name__ == "__main__":
    main()
