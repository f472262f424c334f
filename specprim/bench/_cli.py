"""``specprim bench``: the command line of :func:`specprim.bench.run` and :func:`specprim.bench.run_grid`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from specprim._names import AUTO, BENCH_BASELINES, METHODS, drafts_with_a_draft_model, is_name, uses_datastore
from specprim._usage import UsageError, as_usage_error, at_least, check_decoding, check_file, check_json_schema
from specprim.bench._datasets import DATASETS
from specprim.models import check_model
from specprim.recipes import add_recipe_arguments, check_recipe_sources, given_fields

_REQUIRED = ("target", "method", "max_new_tokens")


def add_bench_parser(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``bench`` sub-command to ``specprim``'s sub-parsers and return its parser."""
    bench = commands.add_parser(
        "bench", help="benchmark methods side by side with model.generate (Spec-Bench style)",
        description="Time every method against plain model.generate on the same prompts, interleaved, and print "
                    "a markdown table (tau, tokens/s, speedup, identical outputs). See docs/bench.md.",
    )
    bench.add_argument("--target", help="target model: a known name, a local path or a hub id")
    bench.add_argument("--method", action="append",
                       help=f"repeatable; 'auto' (the recipe tuned for the target) or one of "
                            f"{list(BENCH_BASELINES + METHODS)}")
    source = bench.add_mutually_exclusive_group()
    source.add_argument("--dataset", choices=sorted(DATASETS), help="a built-in dataset (fetched once, cached)")
    source.add_argument("--prompts", type=Path, help='a JSONL file of {"prompt": ...} or {"turns": [...]} records')
    bench.add_argument("--max-new-tokens", type=int)
    bench.add_argument("--num-prompts", type=int, help="use the first K prompts (default: all)")
    bench.add_argument("--turns", type=int, help="use the first N turns of every prompt (1: first turns only)")
    bench.add_argument("--temperature", type=float, default=0.0)
    bench.add_argument("--top-k", type=int)
    bench.add_argument("--top-p", type=float)
    bench.add_argument("--repeats", type=int, default=1, help="measure every (prompt, method) R times")
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--json-schema", type=Path,
                       help="decode every method (hf included) under this JSON schema (needs specprim[structured])")
    bench.add_argument("--predict", action="store_true",
                       help="time verification against tree size and print the speedup model's prediction")
    bench.add_argument("--json", type=Path, help="write the results (per-prompt rows, summaries, meta) here")
    bench.add_argument("--plot", type=Path, help="write speedup.png and acceptance_by_depth.png into this directory")
    bench.add_argument("--grid", type=Path, help="run an ablation grid from this TOML file instead (see docs)")
    bench.add_argument("--grid-out", type=Path, help="results JSONL of --grid (default: next to it, .jsonl)")
    add_recipe_arguments(bench)
    bench.set_defaults(func=bench_command)
    return bench


def bench_command(args: argparse.Namespace) -> int:
    if args.grid is not None:
        return _grid_command(args)
    if args.method is None and hasattr(args, "recipe"):
        args.method = []  # the recipe is the method
    check_bench(args)
    from specprim.bench._run import run

    results = run(
        target=args.target, methods=args.method, dataset=args.dataset, prompts=args.prompts,
        num_prompts=args.num_prompts, turns=args.turns, max_new_tokens=args.max_new_tokens,
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, repeats=args.repeats,
        predict=args.predict, seed=args.seed, json_path=args.json, plot_dir=args.plot, json_schema=args.json_schema,
        progress=sys.stderr.isatty(), **run_options(args),
    )
    print(results.markdown())
    by_context = results.tau_by_context()
    if by_context:
        from specprim.bench._context import context_table

        print(f"\ntau by prompt length:\n{context_table(by_context)}")
    print(f"\ncommand: {results.meta['command_line']}")
    return 0


def check_bench(args: argparse.Namespace) -> None:
    """Refuse (``UsageError``), before anything loads, the options of a ``bench`` run that cannot work: missing or
    out of range, a method or file that is not there, options no method uses (which :func:`run` refuses too)."""
    missing = [f"--{name.replace('_', '-')}" for name in _REQUIRED if getattr(args, name) is None]
    if args.dataset is None and args.prompts is None:
        missing.append("--dataset or --prompts")
    if missing:
        raise UsageError(f"missing {', '.join(missing)}")
    if args.grid_out is not None:
        raise UsageError("--grid-out names the results of --grid; pass --grid FILE too")
    check_decoding(args)
    for option, least in (("num_prompts", 1), ("turns", 1), ("repeats", 1)):
        at_least(f"--{option.replace('_', '-')}", getattr(args, option), least)
    check_file("--prompts", args.prompts)
    check_json_schema(args.json_schema)
    check_model("--target", args.target)
    unknown = [m for m in args.method if m != AUTO and m not in BENCH_BASELINES and not is_name(m)]
    if unknown:
        raise UsageError(f"unknown method {unknown[0]!r}; choose from 'auto', {', '.join(BENCH_BASELINES + METHODS)} "
                         "or presets joined by '+'")
    fields = given_fields(args)
    check_recipe_sources(fields)
    if fields.get("verifier") == "static":
        raise UsageError("bench verifies eagerly or compiled (--verifier compiled); pass a recipe for others")
    if "min_padded" in fields:
        raise UsageError("bench takes --min-padded from a recipe only (--recipe FILE)")
    if fields.get("pack") and fields.get("compile"):
        raise UsageError("--pack and --compile exclude each other: compiling with freezing packs the weights itself")
    if "tree" in fields:
        from specprim.trees import parse_tree

        with as_usage_error():
            parse_tree(fields["tree"])
    for field, option, applies, needs in (
            ("draft_vocab", "--draft-vocab", drafts_with_a_draft_model, "a leviathan method"),
            ("max_nodes", "--max-nodes", lambda m: "+" in m, "a union (methods joined by '+')"),
            ("datastores", "--datastore", uses_datastore, "a method with a datastore part")):
        if field in fields and not any(map(applies, args.method)):
            raise UsageError(f"{option} applies to {needs}; no method is one")
    if hasattr(args, "recipe"):
        from specprim.recipes import load_recipe

        with as_usage_error():
            check_recipe_sources(load_recipe(args.recipe).changes())


def run_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of :func:`specprim.bench.run` that the recipe options on the command line give:
    the run's loading, verifying and drafting options, and ``recipes`` for ``--recipe NAME|FILE``. Without
    ``--dtype``, a run with ``auto`` or ``--recipe`` loads the target in that recipe's dtype (``auto`` measures an
    unknown target once per machine to choose its recipe). :func:`check_bench` first."""
    from specprim.recipes import auto, load_recipe

    fields = given_fields(args)
    verifier = fields.pop("verifier", "eager")
    options: dict[str, Any] = {"static_verify": verifier == "compiled", "recipes": {}}
    if hasattr(args, "recipe"):
        options["recipes"][args.recipe] = load_recipe(args.recipe)
    leading = next(iter(options["recipes"].values()), None)
    if leading is None and AUTO in args.method:
        leading = auto(args.target, temperature=args.temperature, dtype=fields.get("dtype")).recipe
    options["dtype"] = fields.pop("dtype", leading.dtype if leading is not None else "float32")
    if "datastores" in fields:
        options["datastore"] = list(fields.pop("datastores"))
    if "draft_vocab" in fields:
        options["draft_vocab"] = fields.pop("draft_vocab")
    return {**options, **fields}


_RUN_OPTIONS = ("target", "method", "dataset", "prompts", "max_new_tokens", "num_prompts", "turns")
"""Options of a single run that ``--grid`` takes from its file instead."""


def _grid_command(args: argparse.Namespace) -> int:
    from specprim.bench._grid import load_grid, run_grid
    from specprim.bench._report import grid_table

    given = [f"--{name.replace('_', '-')}" for name in _RUN_OPTIONS if getattr(args, name) is not None]
    if given:
        raise UsageError(f"--grid takes every setting from its file; drop {', '.join(given)}")
    check_file("--grid", args.grid)
    with as_usage_error():
        cells = load_grid(args.grid)
    out = args.grid_out or args.grid.with_suffix(".jsonl")
    records = run_grid(cells, out)
    print(grid_table(records))
    print(f"\nresults: {out}")
    return 0
