"""``specprim bench``: the command line of :func:`specprim.bench.run` and :func:`specprim.bench.run_grid`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specprim.bench._datasets import DATASETS, DatasetFetchError
from specprim.bench._run import DTYPES, run
from specprim.models import QUANTIZE_SCHEMES
from specprim.presets import DATASTORE_HELP, DRAFT_VOCAB_HELP, MAX_NODES_HELP
from specprim.trees._spec import SPEC_HELP

_REQUIRED = ("target", "method", "max_new_tokens")


def add_bench_parser(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``bench`` sub-command to ``specprim``'s sub-parsers and return its parser."""
    from specprim.bench._methods import method_names

    bench = commands.add_parser(
        "bench", help="benchmark methods side by side with model.generate (Spec-Bench style)",
        description="Time every method against plain model.generate on the same prompts, interleaved, and print "
                    "a markdown table (tau, tokens/s, speedup, identical outputs). See docs/bench.md.",
    )
    bench.add_argument("--target", help="target model: a known name, a local path or a hub id")
    bench.add_argument("--method", action="append", help=f"repeatable; one of {list(method_names())}")
    source = bench.add_mutually_exclusive_group()
    source.add_argument("--dataset", choices=sorted(DATASETS), help="a built-in dataset (fetched once, cached)")
    source.add_argument("--prompts", type=Path, help='a JSONL file of {"prompt": ...} or {"turns": [...]} records')
    bench.add_argument("--max-new-tokens", type=int)
    bench.add_argument("--num-prompts", type=int, help="use the first K prompts (default: all)")
    bench.add_argument("--turns", type=int, help="use the first N turns of every prompt (1: first turns only)")
    bench.add_argument("--temperature", type=float, default=0.0)
    bench.add_argument("--top-k", type=int)
    bench.add_argument("--top-p", type=float)
    bench.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    bench.add_argument("--quantize", choices=QUANTIZE_SCHEMES,
                       help="weight-only quantize the target's linear layers (hf and every method use that model)")
    bench.add_argument("--pack", action="store_true",
                       help="pre-pack the bfloat16 target's (and draft's) linears for oneDNN (CPU); hf and every "
                            "method use that model, hf-unpacked times the stock kernels")
    bench.add_argument("--compile", action="store_true",
                       help="torch.compile the target's (and draft's) forward (not with --pack); hf and every method "
                            "use it, and it compiles during the untimed warm-up")
    bench.add_argument("--static-verify", action="store_true",
                       help="specprim methods verify with a static KV cache and padded trees, torch.compiled with "
                            "static shapes (compiles in the warm-up); hf modes keep model.generate")
    bench.add_argument("--static-draft", action="store_true",
                       help="specprim methods draft through static, compiled draft models (draft LMs, EAGLE heads; "
                            "compiled before the warm-up); hf-assisted keeps the draft's own forward")
    bench.add_argument("--warmup-tokens", type=int, default=8,
                       help="tokens each method generates on the first prompt before timing (default 8)")
    bench.add_argument("--draft", help="draft model for leviathan and hf-assisted")
    bench.add_argument("--draft-quantize", choices=QUANTIZE_SCHEMES, help="weight-only quantize the --draft model")
    bench.add_argument("--draft-vocab", type=int, help=DRAFT_VOCAB_HELP)
    bench.add_argument("--num-draft", type=int, help="draft tokens per step (default: each method's own)")
    bench.add_argument("--head", type=Path, help="head directory for medusa, eagle, eagle3, mtp (passed as head=)")
    bench.add_argument("--exit-layer", type=int, help="layer the early-exit preset drafts from")
    bench.add_argument("--datastore", action="append", help=DATASTORE_HELP)
    bench.add_argument("--max-nodes", type=int, help=MAX_NODES_HELP)
    bench.add_argument("--predict", action="store_true",
                       help="time verification against tree size and print the speedup model's prediction")
    bench.add_argument("--tree", help=f"replace the presets' tree shapes: {SPEC_HELP} (see specprim tune)")
    bench.add_argument("--acceptance", help="replace the presets' acceptance rule: speculative, greedy or typical")
    bench.add_argument("--repeats", type=int, default=1, help="measure every (prompt, method) R times")
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--json", type=Path, help="write the results (per-prompt rows, summaries, meta) here")
    bench.add_argument("--plot", type=Path, help="write speedup.png and acceptance_by_depth.png into this directory")
    bench.add_argument("--grid", type=Path, help="run an ablation grid from this TOML file instead (see docs)")
    bench.add_argument("--grid-out", type=Path, help="results JSONL of --grid (default: next to it, .jsonl)")
    bench.set_defaults(func=bench_command)
    return bench


def bench_command(args: argparse.Namespace) -> int:
    if args.grid is not None:
        return _grid_command(args)
    missing = [f"--{name.replace('_', '-')}" for name in _REQUIRED if getattr(args, name) is None]
    if args.dataset is None and args.prompts is None:
        missing.append("--dataset or --prompts")
    if missing:
        raise SystemExit(f"specprim bench: missing {', '.join(missing)}")
    try:
        results = run(
            target=args.target, methods=args.method, dataset=args.dataset, prompts=args.prompts,
            num_prompts=args.num_prompts, turns=args.turns, max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k, top_p=args.top_p, dtype=args.dtype, quantize=args.quantize, pack=args.pack,
            compile=args.compile, static_verify=args.static_verify,
            static_draft=args.static_draft, warmup_tokens=args.warmup_tokens,
            draft=args.draft,
            draft_quantize=args.draft_quantize, num_draft=args.num_draft,
            head=args.head, exit_layer=args.exit_layer, tree=args.tree, acceptance=args.acceptance,
            draft_vocab=args.draft_vocab, datastore=args.datastore, max_nodes=args.max_nodes,
            repeats=args.repeats, predict=args.predict,
            seed=args.seed, json_path=args.json,
            plot_dir=args.plot, progress=sys.stderr.isatty(),
        )
    except (ValueError, DatasetFetchError) as error:
        raise SystemExit(f"specprim bench: {error}") from error
    print(results.markdown())
    print(f"\ncommand: {results.meta['command_line']}")
    return 0


def _grid_command(args: argparse.Namespace) -> int:
    from specprim.bench._grid import run_grid
    from specprim.bench._report import grid_table

    out = args.grid_out or args.grid.with_suffix(".jsonl")
    try:
        records = run_grid(args.grid, out)
    except (ValueError, DatasetFetchError) as error:
        raise SystemExit(f"specprim bench --grid: {error}") from error
    print(grid_table(records))
    print(f"\nresults: {out}")
    return 0
