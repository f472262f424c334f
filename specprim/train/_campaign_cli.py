"""``specprim campaign run | status | curve | tau``: the command-line front of :mod:`specprim.train._campaign`."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from specprim import models
from specprim._names import TRAIN_DATA_SOURCES
from specprim._usage import UsageError, as_usage_error, at_least, check_file
from specprim.models import check_model

if TYPE_CHECKING:
    from specprim.train._campaign import Campaign

__all__ = ["add_campaign_parser"]

# option -> (part of the campaign, field, parser of the value)
_OPTIONS = {
    "target": (None, "target", str),
    "distill_dtype": (None, "distill_dtype", str),
    "feature_dtype": (None, "feature_dtype", str),
    "data": ("data", "source", str),
    "answers": ("data", "answers", str),
    "skip_first": ("data", "skip_first", int),
    "exclude_benchmarks": ("data", "exclude_benchmarks", lambda v: tuple(x for x in v.split(",") if x)),
    "max_prompt_chars": ("data", "max_prompt_chars", int),
    "max_turns": ("data", "max_turns", int),
    "holdout": ("data", "holdout", int),
    "shard_sizes": ("data", "shard_sizes", lambda v: tuple(int(x) for x in v.split(","))),
    "temperatures": ("data", "temperatures", lambda v: tuple(float(x) for x in v.split(","))),
    "passes": ("data", "passes", int),
    "max_new_tokens": ("data", "max_new_tokens", int),
    "max_prompt_tokens": ("data", "max_prompt_tokens", int),
    "distill_batch_size": ("data", "batch_size", int),
    "max_length": ("data", "max_length", int),
    "top_k": ("data", "top_k", int),
    "data_seed": ("data", "seed", int),
    "init_from": ("head", "init_from", str),
    "draft_vocab_size": ("head", "draft_vocab_size", int),
    "steps": ("head", "steps", int),
    "loss_on": ("head", "loss_on", str),
    "head_layers": ("head", "head_layers", int),
    "lr": ("head", "lr", float),
    "warmup_steps": ("head", "warmup_steps", int),
    "batch_tokens": ("head", "batch_tokens", int),
    "mixed_precision": ("head", "mixed_precision", str),
    "train_ratio": ("head", "train_ratio", float),
    "segment_steps": ("head", "segment_steps", int),
    "checkpoint_every": ("head", "checkpoint_every", int),
    "log_every": ("head", "log_every", int),
    "milestones": ("head", "milestones", lambda v: tuple(int(float(x)) for x in v.split(","))),
    "max_train_tokens": ("head", "max_train_tokens", lambda v: int(float(v))),
    "seed": ("head", "seed", int),
}


def add_campaign_parser(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``campaign`` sub-command (``run``, ``status``, ``curve``, ``tau``) to ``specprim``'s sub-parsers and
    return its parser."""
    parser = commands.add_parser(
        "campaign", help="a resumable, many-hour training campaign for an EAGLE-3 head (growing self-distilled data)",
        description="Self-distillation in shards -> target features per shard -> training over every shard so far, "
                    "with held-out evaluations and head snapshots at token milestones. Rerun `run` to resume. "
                    "See docs/train.md.",
    )
    actions = parser.add_subparsers(dest="campaign_command", required=True)
    run = actions.add_parser("run", help="start or resume a campaign",
                             description="Start a campaign in RUN_DIR, or resume the one there (its settings are "
                                         "read from RUN_DIR/campaign.json; options that differ are refused).")
    run.add_argument("run_dir")
    run.add_argument("--target", help="target model: a known name, a local path or a hub id "
                                      "(default smollm2-135m-instruct)")
    dtypes = ("auto", "float32", "bfloat16")
    run.add_argument("--distill-dtype", choices=dtypes,
                     help="the target's dtype while answering (default auto: bfloat16 where this machine computes it "
                          "natively, else float32; may change when a run resumes)")
    run.add_argument("--feature-dtype", choices=dtypes, help="the target's dtype while computing features (as above)")
    data = run.add_argument_group("data plan")
    data.add_argument("--data", help="'sharegpt' (default), 'sharegpt-code' (its conversations with a fenced code "
                                     "block in an answer) or a JSONL file of conversations")
    data.add_argument("--answers", choices=("target", "source"),
                      help="who writes the training answers: the target itself (default, self-distillation) or the "
                           "source's own assistant turns (labels still the target's); held out: the target's either "
                           "way")
    data.add_argument("--skip-first", help="source items never used (default 200)")
    data.add_argument("--exclude-benchmarks", help="comma-separated benchmark datasets whose questions are left out "
                                                   "(default mt-bench,humaneval,gsm; '' for none)")
    data.add_argument("--max-prompt-chars")
    data.add_argument("--max-turns", help="assistant turns answered per conversation (default 3)")
    data.add_argument("--holdout", help="held-out conversations (default 64)")
    data.add_argument("--shard-sizes", help="conversations per shard, comma-separated; the last repeats "
                                            "(default 256,1024,2048)")
    data.add_argument("--temperatures", help="answer temperatures, cycled over shards (default 0,1)")
    data.add_argument("--passes", help="passes over the conversations (default 2)")
    data.add_argument("--max-new-tokens")
    data.add_argument("--max-prompt-tokens")
    data.add_argument("--distill-batch-size", help="conversations answered at once (default 64; may change when a "
                                                   "run resumes)")
    data.add_argument("--max-length", help="tokens per rendered conversation (default 1024)")
    data.add_argument("--top-k")
    data.add_argument("--data-seed")
    head = run.add_argument_group("head")
    head.add_argument("--init-from", help="continue this saved head (a directory or a shipped head's name)")
    head.add_argument("--draft-vocab-size")
    head.add_argument("--steps", help="training-time test depths (default 3)")
    head.add_argument("--loss-on", choices=("all", "assistant"))
    head.add_argument("--head-layers", help="decoder layers of the head (default: 1 fresh, or --init-from's own; more "
                                            "grows that head, the added layers starting as the identity)")
    head.add_argument("--lr")
    head.add_argument("--warmup-steps")
    head.add_argument("--batch-tokens")
    head.add_argument("--mixed-precision", choices=("auto", "no", "bf16"),
                      help="bf16 autocast while training (default auto: where bfloat16 is native; may change when a "
                           "run resumes)")
    head.add_argument("--train-ratio", help="tokens trained per cached token (default 2; may change when a run "
                                            "resumes: raised, the head trains on over the shards it has)")
    head.add_argument("--segment-steps", help="most steps between held-out evaluations (default 100)")
    head.add_argument("--checkpoint-every")
    head.add_argument("--log-every")
    head.add_argument("--milestones", help="trained-token counts of head snapshots, comma-separated "
                                           "(default 5e5,1e6,2e6,5e6,1e7)")
    head.add_argument("--max-train-tokens", help="end after this many trained tokens (default: the last milestone; "
                      "may change when a run resumes)")
    head.add_argument("--seed")
    run.add_argument("--retrain", action="store_true",
                     help="accept changed head settings: the training so far moves to RUN_DIR/retrained-N/ and the "
                          "head trains again on the data already made")
    budget = run.add_argument_group("this run only")
    budget.add_argument("--threads", help="torch intra-op threads (default: torch's), or 'auto': before each unit "
                                          "of work, as many as the CPUs no other process keeps busy (at least 1)")
    budget.add_argument("--max-seconds", type=float, help="stop before the next unit of work after this long")
    budget.add_argument("--max-items", type=int, help="stop after this many units of work (batches, shards, "
                                                      "segments)")
    run.set_defaults(func=run_command)
    status = actions.add_parser("status", help="tokens generated / cached / trained, held-out accuracy, ETA")
    status.add_argument("run_dir")
    status.set_defaults(func=status_command)
    curve = actions.add_parser("curve", help="the scaling curve: held-out top-1 by depth against tokens trained",
                               description="One table per campaign; with --png, one chart with a colour per campaign "
                                           "(e.g. the same data with a larger head, or other data).")
    curve.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    curve.add_argument("--png", help="write the curve as a PNG here (needs matplotlib)")
    curve.add_argument("--markdown", help="write the table as markdown here (it is printed either way)")
    curve.set_defaults(func=curve_command)
    tau = actions.add_parser(
        "tau", help="tau in decoding of the campaign's heads (its start, each milestone, the latest)",
        description="Speculative decoding with each head of RUN_DIR on the first turns of a benchmark; every "
                    "measurement is kept in RUN_DIR/tau.jsonl and none is made twice, so rerun it as milestones "
                    "come. `campaign curve` shows the numbers beside the held-out ones.")
    tau.add_argument("run_dir")
    tau.add_argument("--prompts", default="mt-bench",
                     help="a built-in dataset's name or a JSONL prompts file (default mt-bench; first turns only)")
    tau.add_argument("--num-prompts", type=int, default=30, help="default 30")
    tau.add_argument("--max-new-tokens", type=int, default=64, help="default 64")
    tau.add_argument("--shape", action="append", dest="shapes", metavar="TEMPERATURE:TREE",
                     help="a temperature and a tree, e.g. 0:dynamic:depth=5,top_k=4,budget=8 (the default) or "
                          "1:sampled:2,1,1,1; repeat for several")
    tau.add_argument("--dtype", choices=("float32", "bfloat16"),
                     help="the target's dtype (default: bfloat16 where this machine computes it natively, else "
                          "float32)")
    tau.add_argument("--heads", help="comma-separated labels of the heads to measure, e.g. 'latest,cooled "
                                     "step1503-decay150' (default: every head)")
    tau.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    tau.set_defaults(func=tau_command)
    cooldown = actions.add_parser(
        "cooldown", help="cool the campaign's head down: its learning rate decayed over some more steps",
        description="Branch from the campaign's latest checkpoint into RUN_DIR/cooldowns/step<S>-decay<N>/ and "
                    "train on the same data in the same order with the learning rate decaying (cosine) to "
                    "--min-lr-ratio of its peak over --steps steps; the campaign itself is left as it was. Rerun to "
                    "resume a killed cool-down. `campaign tau` measures the cooled heads, `campaign curve` shows them.")
    cooldown.add_argument("run_dir")
    cooldown.add_argument("--steps", type=int, help="decay steps (default: 10%% of the steps trained so far)")
    cooldown.add_argument("--min-lr-ratio", type=float, default=0.0,
                          help="the last learning rate as a fraction of the peak (default 0)")
    cooldown.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    cooldown.set_defaults(func=cooldown_command)
    return parser


def campaign_from_args(args: argparse.Namespace):
    """The campaign in ``args.run_dir`` (or the defaults) with the options given on the command line applied."""
    from specprim.train._campaign import CONFIG_NAME, Campaign, CampaignData, CampaignHead, load_campaign

    given = {name: getattr(args, name) for name in _OPTIONS if getattr(args, name, None) is not None}
    try:
        values = {name: _OPTIONS[name][2](value) for name, value in given.items()}
    except ValueError as error:
        raise ValueError(f"cannot read an option value: {error}") from error
    base = load_campaign(args.run_dir) if (Path(args.run_dir) / CONFIG_NAME).is_file() else None
    top = {field: value for name, value in values.items() for part, field, _ in [_OPTIONS[name]] if part is None}
    parts = {part: {field: value for name, value in values.items() for p, field, _ in [_OPTIONS[name]] if p == part}
             for part in ("data", "head")}
    if base is None:
        return Campaign(target=top.pop("target", "smollm2-135m-instruct"), run_dir=args.run_dir, **top,
                        data=CampaignData(**parts["data"]), head=CampaignHead(**parts["head"]))
    return dataclasses.replace(base, **top, data=dataclasses.replace(base.data, **parts["data"]),
                               head=dataclasses.replace(base.head, **parts["head"]))


def check_run(args: argparse.Namespace) -> None:
    """Refuse (``UsageError``) the options of ``campaign run`` that cannot work, before anything loads: out of range,
    files or heads that are not there. The settings themselves are checked by :func:`campaign_from_args`."""
    if args.threads not in (None, "auto") and (not args.threads.isdigit() or int(args.threads) < 1):
        raise UsageError(f"--threads must be a number >= 1 or 'auto', got {args.threads!r}")
    at_least("--max-seconds", args.max_seconds, 0)
    at_least("--max-items", args.max_items, 0)
    if args.data is not None and args.data not in TRAIN_DATA_SOURCES:
        check_file("--data", args.data)
    check_model("--target", args.target)
    if args.init_from is not None:
        with as_usage_error():
            models.head_path(args.init_from)


def check_resumable(campaign: Campaign, retrain: bool) -> None:
    """Refuse settings that differ from those the campaign in its run directory was started with (unless only the
    head's differ and ``retrain``): the rule :func:`specprim.train._campaign.run_campaign` applies, here before
    anything loads."""
    from specprim.train._campaign import CONFIG_NAME, load_campaign, settings_conflict

    if not (Path(campaign.run_dir) / CONFIG_NAME).is_file():
        return
    conflict = settings_conflict(load_campaign(campaign.run_dir), campaign, retrain)
    if conflict:
        raise UsageError(conflict)


def run_command(args: argparse.Namespace) -> int:
    check_run(args)
    import torch

    from specprim.train._campaign import adapt_threads, format_status, run_campaign

    def log(line: str) -> None:
        print(line, flush=True)

    with as_usage_error():
        campaign = campaign_from_args(args)
    check_resumable(campaign, args.retrain)
    before_unit = None
    if args.threads == "auto":
        before_unit = adapt_threads(os.cpu_count() or 1, log=log)
    elif args.threads is not None:
        torch.set_num_threads(int(args.threads))
    status = run_campaign(campaign, max_seconds=args.max_seconds, max_items=args.max_items, log=log,
                          before_unit=before_unit, retrain=args.retrain)
    print(format_status(status))
    sys.stdout.flush()
    return 0


def status_command(args: argparse.Namespace) -> int:
    from specprim.train._campaign import campaign_status, format_status

    require_campaign(args.run_dir)
    print(format_status(campaign_status(args.run_dir)))
    return 0


def curve_command(args: argparse.Namespace) -> int:
    from specprim.train._scaling import cooldown_rows, cooldown_table, plot_scaling, scaling_rows, scaling_table

    runs, cooled = {}, {}
    for run_dir in args.run_dirs:
        require_campaign(run_dir)
        try:
            runs[run_dir] = scaling_rows(run_dir)
        except ValueError as error:
            raise UsageError(str(error)) from None
        cooled[run_dir] = cooldown_rows(run_dir)
    several = len(runs) > 1
    table = "".join((f"{run_dir}:\n\n" if several else "") + scaling_table(rows)
                    + (f"\ncool-downs:\n\n{cooldown_table(cooled[run_dir])}" if cooled[run_dir] else "")
                    + ("\n" if several else "")
                    for run_dir, rows in runs.items())
    print(table, end="")
    if args.markdown:
        Path(args.markdown).write_text(table)
    if args.png:
        plot_scaling({Path(run_dir).name: rows for run_dir, rows in runs.items()}, args.png,
                     title="campaign " + ", ".join(Path(run_dir).name for run_dir in args.run_dirs),
                     cooled={Path(run_dir).name: rows for run_dir, rows in cooled.items()})
        print(f"curve: {args.png}")
    return 0


def tau_command(args: argparse.Namespace) -> int:
    from specprim.train._campaign_tau import DEFAULT_SHAPES, measure_campaign_tau, parse_shape, select_heads
    from specprim.train._run_files import TAU_NAME

    require_campaign(args.run_dir)
    at_least("--num-prompts", args.num_prompts, 1)
    at_least("--max-new-tokens", args.max_new_tokens, 1)
    at_least("--threads", args.threads, 1)
    with as_usage_error():
        shapes = [parse_shape(text) for text in args.shapes] if args.shapes else list(DEFAULT_SHAPES)
    import torch

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    dtype = args.dtype or models.native_dtype()
    heads = None if args.heads is None else [label.strip() for label in args.heads.split(",") if label.strip()]
    with as_usage_error():
        select_heads(args.run_dir, heads)  # an unknown label is refused before the target loads
    rows = measure_campaign_tau(args.run_dir, prompts=args.prompts, num_prompts=args.num_prompts,
                                max_new_tokens=args.max_new_tokens, shapes=shapes, dtype=dtype, heads=heads,
                                log=lambda line: print(line, flush=True))
    print(f"{len(rows)} measurements in {Path(args.run_dir) / TAU_NAME}; `specprim campaign curve "
          f"{args.run_dir}` shows them")
    return 0


def cooldown_command(args: argparse.Namespace) -> int:
    require_campaign(args.run_dir)
    at_least("--steps", args.steps, 1)
    at_least("--threads", args.threads, 1)
    if not 0 <= args.min_lr_ratio <= 1:
        raise UsageError(f"--min-lr-ratio must be in [0, 1], got {args.min_lr_ratio}")
    import torch

    from specprim.train._campaign_cooldown import cool_down, plan_cooldown

    with as_usage_error():
        plan_cooldown(args.run_dir, args.steps, min_lr_ratio=args.min_lr_ratio)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    cool_down(args.run_dir, args.steps, min_lr_ratio=args.min_lr_ratio, log=lambda line: print(line, flush=True))
    return 0


def require_campaign(run_dir: str) -> None:
    """``UsageError`` unless ``run_dir`` holds a campaign's settings file."""
    from specprim.train._campaign import CONFIG_NAME

    if not (Path(run_dir) / CONFIG_NAME).is_file():
        raise UsageError(f"no campaign in {run_dir} ({CONFIG_NAME} missing)")
