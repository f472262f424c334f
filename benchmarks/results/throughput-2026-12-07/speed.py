"""Campaign throughput before and after three changes, side by side in one run on a campaign's own data.

    python benchmarks/results/throughput-2026-12-07/speed.py distill campaigns/smollm2-eagle3-fresh --shard 3
    python benchmarks/results/throughput-2026-12-07/speed.py train campaigns/smollm2-eagle3-fresh
    python benchmarks/results/throughput-2026-12-07/speed.py cache campaigns/smollm2-eagle3-fresh --shard 2

``distill``: answers (temperature of the shard, ``--new-tokens``) to the conversations at positions ``--start ..
--start + --prompts`` of the shard's self-distilled file, cut before their ``--turn``-th answer (first turns by
default; conversations with fewer turns left out), through :func:`specprim.train._answers.answer_prompts` in
bfloat16 with packed linears, drawing each token with ``torch.multinomial`` (before) and with
:func:`specprim.sampling.sample` (after), at each ``--batch-sizes`` (``--after-only``: the new path only).
Answer tokens per second.

``train``: EAGLE-3 training steps over the campaign's cached shards (its head settings, a fresh head, AdamW, bf16
autocast where native), with the log-softmax loss and SDPA over the unrolled mask (before) against the chunked loss
and the merged attention (after); ``--warmup`` steps, then ``--steps`` timed. Trained tokens per second.

``cache``: the feature-cache computation (the target's hidden states and top-K log-probabilities) of the first
``--prompts`` conversations of the shard's self-distilled file, as the campaign renders them, in its feature dtype:
a whole float32 log-softmax then top-K (before) against :func:`specprim.train._features.top_logprobs_of` (after).
Rendered tokens per second.

Run it on a quiet machine (stop any campaign first).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path

import torch

from specprim import models
from specprim.train import _answers, _features, _losses, _objective
from specprim.train._campaign import (
    _Budget,
    _Runner,
    load_campaign,
    plan_shards,
    render_all,
    resolved_dtype,
    resolved_mixed_precision,
)


def _log_softmax_loss(logits, topk_ids, topk_logprobs, mask, *, t2d=None, greedy=False):
    """The loss as it was: a float32 log-softmax over the whole batch, then a gather."""
    ids, probs = _losses._target_probs(topk_ids, topk_logprobs, t2d, greedy)
    logq = torch.log_softmax(logits.float(), dim=-1)
    loss = -(probs * logq.gather(-1, ids.clamp(min=0))).sum(-1)
    weight = mask.to(loss.dtype)
    return (loss * weight).sum() / weight.sum().clamp(min=1.0)


def _multinomial(logits, temperature):
    if temperature == 0:
        return logits.argmax(dim=-1)
    return torch.multinomial(torch.softmax(logits.float() / temperature, dim=-1), 1).squeeze(-1)


def _whole_log_softmax_top(logits, top_k):
    values, ids = torch.log_softmax(logits.float(), dim=-1).topk(top_k, dim=-1)
    return ids, values


@contextlib.contextmanager
def _before(part: str):
    """The code paths as they were before the change, for the duration of the block."""
    saved = {}
    if part == "distill":
        saved[(_answers, "pick_tokens")] = _answers.pick_tokens
        _answers.pick_tokens = _multinomial
    elif part == "cache":
        saved[(_features, "top_logprobs_of")] = _features.top_logprobs_of
        _features.top_logprobs_of = _whole_log_softmax_top
    else:
        saved[(_objective, "unrolled_attention_in")] = _objective.unrolled_attention_in
        _objective.unrolled_attention_in = lambda config: contextlib.nullcontext()
        from specprim.train import _unrolled

        saved[(_unrolled, "soft_cross_entropy")] = _unrolled.soft_cross_entropy
        _unrolled.soft_cross_entropy = _log_softmax_loss
    try:
        yield
    finally:
        for (owner, name), value in saved.items():
            setattr(owner, name, value)


def distill(args: argparse.Namespace) -> None:
    campaign = load_campaign(args.run_dir)
    model, tokenizer = models.load(campaign.target, dtype=torch.bfloat16, pack=models.packing_supported())
    directory = Path(args.run_dir) / "shards" / f"{args.shard:05d}"
    path = directory / "distilled.jsonl"
    path = path if path.is_file() else directory / ".distilled.jsonl.partial"
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line]
    temperature = json.loads((directory / "distilled.json").read_text())["temperature"] if (
        directory / "distilled.json").is_file() else 1.0
    prompts = []
    for conversation in lines[args.start:args.start + args.prompts]:
        answers = [i for i, m in enumerate(conversation) if m["role"] == "assistant"]
        if len(answers) < args.turn:
            continue
        text = tokenizer.apply_chat_template(conversation[:answers[args.turn - 1]], tokenize=False,
                                             add_generation_prompt=True)
        prompts.append(tokenizer(text, add_special_tokens=False).input_ids[-512:])
    print(f"{len(prompts)} prompts at turn {args.turn}, {sum(map(len, prompts)) / len(prompts):.0f} tokens on "
          f"average", flush=True)
    ends = {tokenizer.eos_token_id}
    for batch_size in args.batch_sizes:
        variants = [("before", _before("distill"))] if not args.after_only else []
        for label, context in [*variants, ("after", contextlib.nullcontext())]:
            with context:
                started, tokens = time.perf_counter(), 0
                for start in range(0, len(prompts), batch_size):
                    torch.manual_seed(start)
                    answers = _answers.answer_prompts(model, prompts[start:start + batch_size],
                                                      max_new_tokens=args.new_tokens,
                                                      temperature=temperature, eos_token_ids=ends)
                    tokens += sum(len(a) for a in answers)
                seconds = time.perf_counter() - started
            print(f"distill batch {batch_size} {label}: {tokens} tokens in {seconds:.1f} s = "
                  f"{tokens / seconds:.0f} tok/s (temperature {temperature:g})", flush=True)


def train(args: argparse.Namespace) -> None:
    from specprim.train._trainer import _freeze_target_modules

    campaign = load_campaign(args.run_dir)
    runner = _Runner(campaign, _Budget(None, None), print)
    shards = [s for s in plan_shards(runner.order(), campaign.data)[1]
              if (runner.shard_dir(s) / "cached.json").is_file()]
    view = Path(args.view)
    view.mkdir(parents=True, exist_ok=True)
    dataset = runner.view(shards, view)
    plan = dataset.batches(0)
    autocast = resolved_mixed_precision(campaign.head.mixed_precision) == "bf16"
    for label, context in (("before", _before("train")), ("after", contextlib.nullcontext())):
        with context:
            torch.manual_seed(0)
            objective = runner.objective(dataset)
            _freeze_target_modules(objective)
            trainable = [p for p in objective.parameters() if p.requires_grad]
            optimizer = torch.optim.AdamW(trainable, lr=1e-4)
            tokens, seconds = 0, 0.0
            for i in range(args.warmup + args.steps):
                batch = dataset.load(plan[i])
                started = time.perf_counter()
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                    out = objective(batch)
                out.loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                if i >= args.warmup:
                    seconds += time.perf_counter() - started
                    tokens += int(batch.attention_mask.sum())
        print(f"train {label}: {tokens} tokens in {seconds:.1f} s = {tokens / seconds:.0f} tok/s "
              f"(loss of the last step {out.metrics['loss']:.3f})", flush=True)


def cache(args: argparse.Namespace) -> None:
    campaign = load_campaign(args.run_dir)
    runner = _Runner(campaign, _Budget(None, None), print)
    directory = Path(args.run_dir) / "shards" / f"{args.shard:05d}"
    lines = (directory / "distilled.jsonl").read_text(encoding="utf-8").split("\n")[: args.prompts]
    examples = render_all(runner.tokenizer, [json.loads(line) for line in lines if line],
                          max_length=campaign.data.max_length)
    model = runner.model(campaign.feature_dtype)
    layers = runner.layers()
    tokens = sum(len(e.input_ids) for e in examples)
    for label, context in (("before", _before("cache")), ("after", contextlib.nullcontext())):
        with context, torch.no_grad():
            _features._shard_tensors(model, examples[:2], layers, campaign.data.top_k, torch.device("cpu"))
            started = time.perf_counter()
            result = _features._shard_tensors(model, examples, layers, campaign.data.top_k, torch.device("cpu"))
            seconds = time.perf_counter() - started
        print(f"cache {label}: {len(examples)} conversations, {tokens} tokens in {seconds:.1f} s = "
              f"{tokens / seconds:.0f} tok/s ({resolved_dtype(campaign.feature_dtype)}; top-1 ids "
              f"{result['topk_ids'][:, 0].sum()})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("part", choices=("distill", "train", "cache"))
    parser.add_argument("run_dir")
    parser.add_argument("--shard", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--turn", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--after-only", action="store_true")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--view", default="/tmp/specprim-speed-view")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    {"distill": distill, "train": train, "cache": cache}[args.part](args)


if __name__ == "__main__":
    main()
