"""A campaign's heads measured in decoding: tau (tokens per target forward, the bonus token included) of each
milestone copy, of the head it started from and of its latest head, on a benchmark's first turns
(``specprim campaign tau RUN_DIR``).

Held-out top-1 (``eval.jsonl``) is teacher-forced; tau is what a user of the head gets. Each measurement is one line
of ``RUN_DIR/tau.jsonl``, written as soon as it is made and never made twice for the same head and settings, so the
command can be stopped at any moment, rerun after more milestones, and :mod:`specprim.train._scaling` puts the
numbers beside the held-out curve.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specprim import presets
from specprim._tau_error import PromptCounts, tau_estimate
from specprim.bench import conversation_ids, load_dataset, read_prompts
from specprim.models import load, load_head
from specprim.train._campaign import load_campaign
from specprim.train._run_files import (
    COOLED,
    EVAL_NAME,
    TAU_NAME,
    finished_cooldowns,
    read_json,
    read_jsonl,
    write_jsonl,
)
from specprim.trees import parse_tree

__all__ = ["DEFAULT_SHAPES", "CampaignHead", "TauShape", "campaign_heads", "measure_campaign_tau", "parse_shape",
           "prompt_counts", "select_heads"]



@dataclass(frozen=True)
class TauShape:
    """One decoding setting: a sampling temperature and a tree spec (:func:`specprim.trees.parse_tree`)."""

    temperature: float
    tree: str

    @property
    def label(self) -> str:
        return f"T={self.temperature:g} {self.tree}"


DEFAULT_SHAPES = (TauShape(0.0, "dynamic:depth=5,top_k=4,budget=8"),)  # greedy, 8 verified nodes


def parse_shape(text: str) -> TauShape:
    """``"0:dynamic:depth=5,top_k=4,budget=8"`` -> ``TauShape(0.0, "dynamic:...")``: a temperature, a colon, a tree.
    ``ValueError`` naming what is wrong."""
    temperature, colon, tree = text.partition(":")
    problem = ValueError(f"a shape is TEMPERATURE:TREE (e.g. 0:chain:4 or 1:sampled:2,1,1), got {text!r}")
    try:
        value = float(temperature)
    except ValueError:
        raise problem from None
    if not colon or not 0 <= value < float("inf"):  # also turns away nan and inf
        raise problem
    parse_tree(tree)  # raises ValueError for a bad tree
    return TauShape(value, tree)


@dataclass(frozen=True)
class CampaignHead:
    """A head of a campaign: ``label`` (``"start"``, a milestone's label or ``"latest"``), the tokens it was trained
    on in the campaign and where it is (a directory, or a shipped head's name for the start)."""

    label: str
    trained_tokens: int
    location: str


def campaign_heads(run_dir: str | os.PathLike[str]) -> list[CampaignHead]:
    """The heads of the campaign in ``run_dir`` in order of tokens trained: the head it continued (``init_from``,
    0 tokens), each milestone copy, the latest head unless a milestone holds the same one or a training segment is
    unfinished (the latest head then changes under the reader), and the head of each finished cool-down (labelled
    ``"cooled <name>"``)."""
    directory = Path(run_dir)
    campaign = load_campaign(directory)
    heads = []
    if campaign.head.init_from is not None:
        heads.append(CampaignHead("start", 0, campaign.head.init_from))
    for info in sorted((directory / "milestones").glob("*/milestone.json")):
        heads.append(CampaignHead(info.parent.name, int(read_json(info)["trained_tokens"]),
                                  os.fspath(info.parent)))
    segment = read_json(directory / "train" / "segment.json")
    records = read_jsonl(directory / EVAL_NAME)
    if segment is not None and segment["done"] and records and (directory / "train" / "head").is_dir():
        tokens = max(records, key=lambda r: r["segment"])["trained_tokens"]
        if tokens > 0 and all(head.trained_tokens != tokens for head in heads):
            heads.append(CampaignHead("latest", tokens, os.fspath(directory / "train" / "head")))
    heads += [CampaignHead(COOLED + record["name"], record["trained_tokens"], record["location"])
              for record in finished_cooldowns(directory)]
    return sorted(heads, key=lambda head: head.trained_tokens)


def select_heads(run_dir: str | os.PathLike[str], labels: Sequence[str] | None = None) -> list[CampaignHead]:
    """The heads of :func:`campaign_heads` labelled ``labels`` (every head for ``None``); ``ValueError`` naming a
    label no head has, and the labels there are."""
    heads = campaign_heads(run_dir)
    if labels is None:
        return heads
    known = [head.label for head in heads]
    unknown = [label for label in labels if label not in known]
    if unknown:
        raise ValueError(f"no head labelled {', '.join(map(repr, unknown))} in {os.fspath(run_dir)}; its heads: "
                         f"{', '.join(known) or 'none yet'}")
    return [head for head in heads if head.label in labels]


def measure_campaign_tau(run_dir: str | os.PathLike[str], *, prompts: str = "mt-bench", num_prompts: int = 30,
                         max_new_tokens: int = 64, shapes: Sequence[TauShape] = DEFAULT_SHAPES,
                         dtype: str = "float32", heads: Sequence[str] | None = None,
                         log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Measure tau for every head of :func:`campaign_heads` (or only those labelled ``heads``) at every shape that
    ``RUN_DIR/tau.jsonl`` lacks, on the first turns of ``num_prompts`` prompts (a built-in dataset's name or a JSONL
    prompts file), ``max_new_tokens`` each, the campaign's target loaded in ``dtype``; sampled shapes draw with one
    seed per prompt. Returns every row of the file afterwards (the ones measured before included). ``ValueError``
    for a label no head has."""
    if num_prompts < 1 or max_new_tokens < 1:
        raise ValueError(f"num_prompts and max_new_tokens must be >= 1, got {num_prompts} and {max_new_tokens}")
    directory = Path(run_dir)
    campaign = load_campaign(directory)
    chosen_heads = select_heads(directory, heads)
    path = directory / TAU_NAME
    rows = read_jsonl(path)
    settings = {"prompts": prompts, "num_prompts": num_prompts, "max_new_tokens": max_new_tokens, "dtype": dtype}
    done = {_key(row) for row in rows}
    todo = {head: missing for head in chosen_heads
            if (missing := [shape for shape in shapes if _key(_setting(head, shape, settings)) not in done])}
    if not todo:
        log(f"tau: nothing to measure ({len(rows)} rows in {path})")
        return rows
    chosen = read_prompts(prompts) if Path(prompts).is_file() else load_dataset(prompts, num_prompts)
    target, tokenizer = load(campaign.target, dtype=getattr(torch, dtype))
    ids = [conversation_ids(tokenizer, prompt.turns[:1], []) for prompt in chosen[:num_prompts]]
    options = {"max_new_tokens": max_new_tokens, "eos_token_id": tokenizer.eos_token_id}
    for head, missing in todo.items():
        drafter = load_head(head.location, target)
        for shape in missing:
            started = time.perf_counter()
            counts = prompt_counts(presets.eagle3(drafter, parse_tree(shape.tree)), target, ids, shape.temperature,
                                   options)
            estimate, steps = tau_estimate(counts), sum(counts.steps)
            row = {**_setting(head, shape, settings), "tau": estimate.tau, "stderr": estimate.stderr, "steps": steps,
                   "prompt_accepted": list(counts.accepted), "prompt_steps": list(counts.steps),
                   "seconds": round(time.perf_counter() - started, 1)}
            rows.append(row)
            write_jsonl(path, rows)
            log(f"tau: {head.label} ({head.trained_tokens:,} tokens trained), {shape.label}: {estimate.tau:.3f} "
                f"+- {estimate.stderr:.3f} over {steps} target forwards ({row['seconds']} s)")
    return rows


def prompt_counts(method: Any, target: Any, ids: Sequence[torch.Tensor], temperature: float,
                  options: dict[str, Any]) -> PromptCounts:
    """Tokens accepted and target forwards of ``method`` on each of the prompts ``ids`` (each (1, T)), decoding with
    ``options`` (``max_new_tokens``, ...) at ``temperature``, prompt ``i`` sampled with seed ``i``."""
    accepted, steps = [], []
    for i, prompt_ids in enumerate(ids):
        out = method.generate(target, prompt_ids, generator=torch.Generator().manual_seed(i), **options,
                              **({"temperature": temperature} if temperature > 0 else {}))
        accepted.append(sum(out.stats.accepted))
        steps.append(out.stats.steps)
    return PromptCounts(accepted, steps)


def _setting(head: CampaignHead, shape: TauShape, settings: dict[str, Any]) -> dict[str, Any]:
    """What a ``tau.jsonl`` row was measured with: the head, its tokens, the shape and the prompts' settings."""
    return {"head": head.label, "trained_tokens": head.trained_tokens, "temperature": shape.temperature,
            "tree": shape.tree, **settings}


def _key(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["head"], row["trained_tokens"], row["temperature"], row["tree"], row["prompts"], row["num_prompts"],
            row["max_new_tokens"], row["dtype"])

