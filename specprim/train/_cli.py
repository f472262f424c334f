"""``specprim train``: the command-line front of :func:`specprim.train.train_drafter`."""

from __future__ import annotations

import argparse

from specprim import models
from specprim._names import LAYERED_TRAIN_KINDS, TRAIN_DATA_SOURCES, TRAIN_KINDS, UNROLLED_TRAIN_KINDS
from specprim._usage import UsageError, as_usage_error, at_least, check_file
from specprim.models import check_model

__all__ = ["add_train_parser"]


def add_train_parser(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``train`` sub-command to ``specprim``'s sub-parsers and return its parser."""
    parser = commands.add_parser(
        "train", help="train a draft head (EAGLE-3, EAGLE-1, Medusa, MTP) or distil a draft LM for a target",
        description="Conversations -> (self-distillation) -> target features cached on disk -> training with "
                    "checkpoints. Rerun the same command to resume. Runs under `accelerate launch` unchanged. "
                    "See docs/train.md.",
    )
    parser.add_argument("kind", choices=TRAIN_KINDS)
    parser.add_argument("--target", default="smollm2-135m-instruct", help="a known name, a local path or a hub id")
    parser.add_argument("--out", required=True, help="output directory (data, features, checkpoints, head)")
    parser.add_argument("--data", default="sharegpt",
                        help="'sharegpt', 'sharegpt-code' (its conversations with a fenced code block in an answer) or "
                             "a JSONL file of conversations")
    parser.add_argument("--num-conversations", type=int, default=2000)
    parser.add_argument("--max-length", type=int, default=1024)
    parser.add_argument("--holdout", type=int, default=32, help="conversations held out for evaluation")
    parser.add_argument("--self-distill", action="store_true", help="let the target rewrite the assistant turns")
    parser.add_argument("--distill-max-new-tokens", type=int, default=256)
    parser.add_argument("--distill-batch-size", type=int, default=16)
    parser.add_argument("--distill-temperature", type=float, default=0.0)
    parser.add_argument("--top-k", type=int, default=16, help="target probabilities kept per position")
    parser.add_argument("--feature-dtype", choices=("float32", "bfloat16"), default="float32",
                        help="dtype of the target while computing features (bfloat16: ~2x faster on AMX CPUs)")
    parser.add_argument("--features-only", action="store_true", help="stop after building the feature cache")
    parser.add_argument("--features", help="a feature cache directory to use or create (shared between runs)")
    parser.add_argument("--draft", help="the draft LM to distil (kind 'distill')")
    parser.add_argument("--draft-vocab-size", type=int,
                        help="EAGLE: reduced draft vocabulary size (with --init-from: widen the saved EAGLE-3 head's "
                             "to this many, adding the data's most frequent greedy tokens)")
    parser.add_argument("--init-from", help="continue training this saved head (a directory or a shipped name)")
    parser.add_argument("--num-heads", type=int, default=4, help="Medusa heads")
    parser.add_argument("--steps", type=int, help="unrolled depths (EAGLE-3 training-time test, MTP); kind "
                        "'parallel': the positions drafted per forward (default 4)")
    parser.add_argument("--loss-on", choices=("all", "assistant"), default="all")
    parser.add_argument("--align", action="store_true",
                        help="token-alignable training (EAGLE, MTP): a depth counts in the loss only where the "
                             "draft's greedy tokens above it matched the target's")
    parser.add_argument("--align-topk", type=int, default=1,
                        help="with --align: a depth counts while the target's token was among the draft's K best "
                             "above it (GRIFFIN's softened mask; default 1, the greedy chain)")
    parser.add_argument("--hass-topk", type=int, default=0,
                        help="add HASS's top-K distillation over the target's K most likely tokens to each depth's "
                             "loss (EAGLE, MTP; K <= --top-k; default 0: off)")
    parser.add_argument("--hass-weight", type=float, help="weight of the --hass-topk loss (default 1.0)")
    parser.add_argument("--head-layers", type=int,
                        help="decoder layers of an EAGLE head (default 1; with --init-from: the saved head's, which "
                             "grows to this many, the added layers starting as the identity)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--max-steps", type=int)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--warmup-steps", type=int, default=50)
    parser.add_argument("--decay-steps", type=int,
                        help="hold the peak --lr until the last DECAY_STEPS steps and decay over those only "
                             "(warm-up, stable, decay; default: a cosine decay over every step after the warm-up)")
    parser.add_argument("--batch-tokens", type=int, default=8192, help="padded tokens per batch")
    parser.add_argument("--checkpoint-every", type=int, default=200)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--eval-every", type=int, default=0)
    parser.add_argument("--mixed-precision", choices=("no", "bf16"), default="no")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    parser.set_defaults(func=train_command)
    return parser


def check_train(args: argparse.Namespace) -> None:
    """Refuse (``UsageError``), before anything loads, options that are out of range, name files or heads that are
    not there, or contradict the kind."""
    if args.kind == "distill" and args.draft is None:
        raise UsageError("kind 'distill' needs --draft MODEL (the draft LM to distil)")
    if args.kind != "distill" and args.draft is not None:
        raise UsageError(f"--draft is the draft LM of kind 'distill'; kind {args.kind!r} trains a head")
    if args.kind == "distill" and args.init_from is not None:
        raise UsageError("kind 'distill' trains the --draft model it is given; --init-from does not apply")
    unrolled = ", ".join(UNROLLED_TRAIN_KINDS)
    if args.align and args.kind not in UNROLLED_TRAIN_KINDS:
        raise UsageError(f"--align trains unrolled draft depths ({unrolled}); kind {args.kind!r} has none")
    if args.align_topk != 1 and not args.align:
        raise UsageError("--align-topk softens --align; pass --align too")
    if args.hass_topk and args.kind not in UNROLLED_TRAIN_KINDS:
        raise UsageError(f"--hass-topk trains unrolled draft depths ({unrolled}); kind {args.kind!r} has none")
    if args.hass_weight is not None and not args.hass_topk:
        raise UsageError("--hass-weight weighs the --hass-topk loss; pass --hass-topk K too")
    if args.hass_weight is not None and not args.hass_weight > 0:
        raise UsageError(f"--hass-weight must be > 0, got {args.hass_weight}")
    if args.head_layers is not None and args.kind not in LAYERED_TRAIN_KINDS:
        raise UsageError(f"--head-layers sets the decoder layers of {', '.join(LAYERED_TRAIN_KINDS)} heads; kind "
                         f"{args.kind!r} has no such choice")
    if args.hass_topk > args.top_k:
        raise UsageError(f"--hass-topk {args.hass_topk} needs that many target probabilities per position; "
                         f"--top-k keeps {args.top_k}")
    for option, least in (("num_conversations", 1), ("max_length", 2), ("holdout", 0), ("distill_max_new_tokens", 1),
                          ("distill_batch_size", 1), ("distill_temperature", 0), ("top_k", 1),
                          ("draft_vocab_size", 1), ("num_heads", 1), ("steps", 1), ("batch_tokens", 1),
                          ("align_topk", 1), ("hass_topk", 0), ("head_layers", 1), ("threads", 1)):
        at_least(f"--{option.replace('_', '-')}", getattr(args, option), least)
    if args.data not in TRAIN_DATA_SOURCES:
        check_file("--data", args.data)
    check_model("--target", args.target)
    check_model("--draft", args.draft)
    if args.init_from is not None:
        with as_usage_error():
            models.head_path(args.init_from)


def train_command(args: argparse.Namespace) -> int:
    check_train(args)
    import torch

    from specprim.train._pipeline import DataConfig, train_drafter
    from specprim.train._trainer import TrainConfig

    with as_usage_error():
        data = DataConfig(
            source=args.data, num_conversations=args.num_conversations, max_length=args.max_length,
            self_distill=args.self_distill, distill_max_new_tokens=args.distill_max_new_tokens,
            distill_batch_size=args.distill_batch_size, distill_temperature=args.distill_temperature,
            holdout=args.holdout, top_k=args.top_k,
        )
        config = TrainConfig(
            epochs=args.epochs, max_steps=args.max_steps, lr=args.lr, warmup_steps=args.warmup_steps,
            decay_steps=args.decay_steps, checkpoint_every=args.checkpoint_every, log_every=args.log_every,
            eval_every=args.eval_every, mixed_precision=args.mixed_precision, seed=args.seed,
        )
    if args.threads:
        torch.set_num_threads(args.threads)
    target, tokenizer = models.load(args.target, dtype=torch.float32)
    feature_model = models.load(args.target, dtype=torch.bfloat16)[0] if args.feature_dtype == "bfloat16" else None
    draft = models.load(args.draft, dtype=torch.float32)[0] if args.draft else None
    head = train_drafter(
        args.kind, target, tokenizer, args.out, data=data, config=config, features_dir=args.features,
        feature_model=feature_model, features_only=args.features_only, draft=draft,
        draft_vocab_size=args.draft_vocab_size, num_heads=args.num_heads, steps=args.steps,
        loss_on=args.loss_on, init_from=args.init_from, batch_tokens=args.batch_tokens, align=args.align,
        align_topk=args.align_topk, hass_topk=args.hass_topk,
        hass_weight=1.0 if args.hass_weight is None else args.hass_weight, head_layers=args.head_layers,
    )
    print(f"feature cache: {head}" if args.features_only else f"trained {args.kind}: {head}")
    return 0
