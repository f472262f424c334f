"""``specprim tune``: measure a method's acceptance and this machine's costs, print the speedup model and the tree
it predicts is fastest (pass it to ``generate`` / ``bench`` as ``--tree``)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from specprim._names import METHODS, is_name
from specprim._usage import as_usage_error, at_least
from specprim.models import check_model
from specprim.recipes import add_recipe_arguments, check_recipe_sources, given_fields, recipe_from_args
from specprim.speedup import LOOKUP_LENGTHS

LOOKUP = "prompt-lookup"
TUNED_HERE = ("--max-nodes", "--tree", "--num-draft")
"""Recipe options ``tune`` does not take: it chooses the tree, and ``--max-nodes`` is its largest tree."""


def _tree_presets() -> str:
    return ", ".join(n for n in METHODS if n != LOOKUP)


def _tunable_method(name: str) -> str:
    """A preset with a tree shape, alone or joined with prompt lookup (``eagle3+prompt-lookup``)."""
    parts = name.split("+")
    tree_parts = [p for p in parts if p != LOOKUP]
    if not is_name(name) or len(tree_parts) != 1 or len(parts) > 2:
        raise argparse.ArgumentTypeError(
            f"{name!r}: tune takes one of {_tree_presets()}, "
            f"optionally joined with {LOOKUP} (e.g. 'eagle3+{LOOKUP}')")
    return name


def _lengths(text: str) -> tuple[int, ...]:
    try:
        lengths = tuple(int(part) for part in text.split(","))
    except ValueError:
        lengths = ()
    if not lengths or min(lengths) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated non-negative ints, e.g. 0,2,4,6")
    return lengths


def add_tune_parser(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``tune`` sub-command to ``specprim``'s sub-parsers and return its parser."""
    from specprim.bench import DATASETS

    tune = commands.add_parser(
        "tune", help="choose the draft tree for this machine from measured costs and acceptance",
        description="Generate greedily with a wide probe tree to measure acceptance by depth and sibling rank, time "
                    "verification against tree size and drafting against depth, and print the predicted speedup of "
                    "the best tree of every size. See docs/speedup.md.",
    )
    tune.add_argument("--target", default="smollm2-135m-instruct", help="a known name, a local path or a hub id")
    tune.add_argument("--method", type=_tunable_method,
                      help=f"(default: the recipe's drafter) one of {_tree_presets()}, optionally joined "
                           "with prompt-lookup ('eagle3+prompt-lookup': the tree is tuned first, then the lookup "
                           "length by replay)")
    tune.add_argument("--dataset", choices=sorted(DATASETS), default="mt-bench")
    tune.add_argument("--num-prompts", type=int, default=6, help="prompts acceptance is measured on")
    tune.add_argument("--max-new-tokens", type=int, default=128,
                      help="tokens per prompt (3 x 48 tokens measured r[1][0] 0.22 where 6 x 128 measured 0.33)")
    tune.add_argument("--max-nodes", dest="largest_tree", type=int, default=64, help="largest tree considered")
    tune.add_argument("--repeats", type=int, default=5, help="timings per tree size (median)")
    tune.add_argument("--lookup-lengths", type=_lengths, default=LOOKUP_LENGTHS,
                      help="comma-separated prompt-lookup lengths tried for a '+prompt-lookup' method (0: none)")
    tune.add_argument("--json", type=Path, help="write acceptance, costs, the curve and the choice here")
    add_recipe_arguments(tune, skip=TUNED_HERE)
    tune.set_defaults(func=tune_command)
    return tune


def tune_command(args: argparse.Namespace) -> int:
    check_tune(args)
    from specprim import presets
    from specprim.bench import conversation_ids, load_dataset
    from specprim.hf import StaticTarget
    from specprim.recipes import load_draft, load_target
    from specprim.speedup import PROBE_TREE, tune, tune_lookup

    with as_usage_error():
        tuned_recipe, recipe = _recipes(args)
    check_recipe_sources(tuned_recipe.changes())
    target, tokenizer = load_target(recipe, args.target)
    draft = load_draft(recipe, tokenizer)
    tree_name = next(p for p in args.method.split("+") if p != LOOKUP)
    method = presets.from_name(tree_name, target=target, draft=draft, head=recipe.head, exit_layer=recipe.exit_layer)
    prompts = [conversation_ids(tokenizer, p.turns[:1], []) for p in load_dataset(args.dataset, args.num_prompts)]
    verifier = target if recipe.verifier == "eager" else StaticTarget(
        target, compile=recipe.verifier == "compiled", min_padded=recipe.min_padded)
    deepest = getattr(getattr(method.drafter, "model", None), "max_depth", None)  # a parallel head drafts K deep
    probe = PROBE_TREE if deepest is None else dataclasses.replace(PROBE_TREE, depth=min(PROBE_TREE.depth, deepest))
    result = tune(verifier, method, prompts, max_new_tokens=args.max_new_tokens, max_nodes=args.largest_tree,
                  repeats=args.repeats, eos_token_id=tokenizer.eos_token_id, probe_tree=probe)
    print(report(result, f"{tree_name} on {args.target} ({recipe}), {len(prompts)} {args.dataset} prompts"))
    record = result.to_json()
    if tree_name != args.method:
        if not result.choice.paths:
            print(f"\nno tree is predicted faster than plain decoding; {LOOKUP} lengths not tuned")
        else:
            tuned = presets.with_tree(method, result.choice.dynamic_tree())
            lookup = tune_lookup(target, tuned, prompts, result.costs, lengths=args.lookup_lengths,
                                 max_new_tokens=args.max_new_tokens, eos_token_id=tokenizer.eos_token_id)
            print("\n" + lookup_report(lookup, tree_name, result.choice.spec()))
            record["lookup"] = lookup.to_json()
    if result.choice.paths and getattr(args, "recipe", None) is not None:
        tuned = dataclasses.replace(tuned_recipe, tree=result.choice.spec())
        print(f"\ntuned recipe: {tuned}")
        record["recipe"] = repr(tuned)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=1))
    return 0


def check_tune(args: argparse.Namespace) -> None:
    """Refuse (``UsageError``), before anything loads, options out of range and names that are not there."""
    for option, value in (("--num-prompts", args.num_prompts), ("--max-new-tokens", args.max_new_tokens),
                          ("--max-nodes", args.largest_tree), ("--repeats", args.repeats)):
        at_least(option, value, 1)
    check_model("--target", args.target)
    check_recipe_sources(given_fields(args))


def _recipes(args: argparse.Namespace) -> tuple[Any, Any]:
    """The recipe being tuned (``--recipe`` or the defaults, with the recipe options typed here on top) and the one
    tune measures with: its tree-shaped drafter alone, on the same loading and verifier. ``--method`` defaults to
    the recipe's drafter without its datastore part."""
    from specprim.recipes import Recipe, load_recipe

    named = getattr(args, "recipe", None)
    base = load_recipe(named) if named is not None else Recipe()
    if args.method is None:
        if named is None:
            raise ValueError("pass --method (or --recipe)")
        try:
            args.method = _tunable_method("+".join(p for p in base.method.split("+") if p != "datastore"))
        except argparse.ArgumentTypeError as error:
            raise ValueError(str(error)) from error
    tuned = recipe_from_args(args, base)
    tree_part = next(p for p in args.method.split("+") if p != LOOKUP)
    measured = dataclasses.replace(tuned, method=tree_part, max_nodes=None, datastores=(), num_draft=None, tree=None)
    return tuned, measured


def report(result: object, title: str) -> str:
    """Markdown: costs, acceptance rates, the predicted curve at a few sizes, and the choice."""
    costs, acc, choice = result.costs, result.acceptance, result.choice
    lines = [f"## tune: {title}", "", f"probe tau {result.probe_tau:.2f}", "",
             "| tree nodes | verify ms | x one step |", "|---|---|---|"]
    lines += [f"| {n} | {1e3 * t:.1f} | {t / costs.step_s:.2f} |" for n, t in zip(costs.verify_sizes, costs.verify_s,
                                                                              strict=True)]
    lines += ["", "| depth | draft ms | acceptance r[d][k], k = 0.. |", "|---|---|---|"]
    for depth in range(1, max(len(costs.draft_s), acc.max_depth) + 1):
        draft_ms = f"{1e3 * costs.draft_s[depth - 1]:.1f}" if depth <= len(costs.draft_s) else "-"
        rates = " ".join(f"{acc.rate(depth, k):.2f}" for k in range(len(acc.trials[depth - 1]))) \
            if depth <= acc.max_depth else "-"
        lines.append(f"| {depth} | {draft_ms} | {rates} |")
    lines += ["", f"other per step {1e3 * costs.other_s:.1f} ms + {1e3 * costs.other_per_node_s:.2f} ms per node", "",
              "| nodes | predicted tau | step ms | predicted speedup |", "|---|---|---|---|"]
    shown = sorted({0, 1, 2, 4, 8, 16, 32, 64, choice.nodes} & {c[0] for c in choice.curve})
    for nodes, tau, step_s, speedup in (c for c in choice.curve if c[0] in shown):
        mark = " (best)" if nodes == choice.nodes else ""
        lines.append(f"| {nodes}{mark} | {tau:.2f} | {1e3 * step_s:.1f} | {speedup:.2f}x |")
    lines += ["", f"best tree: --tree {choice.spec()}  (predicted tau {choice.prediction.tau:.2f}, "
                  f"{choice.prediction.speedup:.2f}x plain decoding through the same forward)"]
    return "\n".join(lines)


def lookup_report(choice: object, tree_name: str, tree_spec: str) -> str:
    """Markdown: every lookup length's replayed tau and predicted speedup, and the options of the fastest."""
    lines = [f"## {LOOKUP} length for {tree_name} with --tree {tree_spec} (greedy replay + cost model)", "",
             "| lookup tokens | tau | nodes | draft ms | step ms | predicted speedup |", "|---|---|---|---|---|---|"]
    best = choice.best
    for row in choice.rows:
        mark = " (best)" if row is best else ""
        lines.append(f"| {row.num_tokens}{mark} | {row.tau:.2f} | {row.nodes:.1f} | {1e3 * row.draft_s:.1f} | "
                     f"{1e3 * row.step_s:.1f} | {row.speedup:.2f}x |")
    options = f"--method {tree_name}" if best.num_tokens == 0 else \
        f"--method {tree_name}+{LOOKUP} --num-draft {best.num_tokens}"
    lines += ["", f"best: {options} --tree {tree_spec}  (predicted {best.speedup:.2f}x plain decoding)"]
    return "\n".join(lines)
