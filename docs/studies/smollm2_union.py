"""Shared by the union benchmarks: SmolLM2-135M-Instruct (bf16, packed) with the shipped EAGLE-3 head and the SmolLM2
answers + ShareGPT datastores, and the union of the three drafters."""

from __future__ import annotations

import argparse

import torch

from specprim import presets
from specprim.drafters import Datastore, EagleHead
from specprim.models import load, load_datastore, load_head
from specprim.trees import DynamicTree

HEAD = "smollm2-135m-instruct-eagle3"
DATASTORES = ["smollm2-135m-instruct-answers", "sharegpt"]


def arguments(description: str) -> argparse.Namespace:
    """The scripts' command line: ``--num-prompts`` (default 10) and ``--json``."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=10)
    parser.add_argument("--json")
    return parser.parse_args()


def load_parts() -> tuple[torch.nn.Module, object, EagleHead, Datastore]:
    """(target, tokenizer, head, datastore) on 2 threads."""
    torch.set_num_threads(2)
    target, tokenizer = load("smollm2-135m-instruct", dtype=torch.bfloat16, pack=True)
    return target, tokenizer, load_head(HEAD, target), load_datastore(DATASTORES, tokenizer)


def union(head: EagleHead, store: Datastore, *, top_k: int, depth: int, max_nodes: int) -> presets.Method:
    """The head's top-``top_k`` + a ``depth``-token prompt-lookup match + the datastore ``depth`` deep, cut to
    ``max_nodes`` nodes."""
    return presets.union(presets.eagle3(head, DynamicTree(depth=1, top_k=top_k, budget=top_k)),
                         presets.prompt_lookup(num_tokens=depth, max_matches=1),
                         presets.datastore(store, num_tokens=depth), max_nodes=max_nodes)
